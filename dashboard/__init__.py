"""Dashboard pieces shared by the rollout and trainer UIs: delta sparsity per layer and tensor kind,
payload sizes per layout, plotly figures (``dashboard.figures``), Wordle boards of policy
trajectories (``dashboard.games``), texts about training progress (``dashboard.trend``) and the words the
public pages share (``dashboard.labels``: counts, locations safe to show, the glossary). (Matches against the policy are the rollout's: ``rollout_space.versus``.)

They only draw: pure functions of data the Spaces already hold, so they are unit-tested without Gradio and reused
by every UI. Nothing here imports Gradio; ``plotly`` is imported by ``figures`` only.
"""

from .payload import dense_bytes, raw_bytes
from .sparsity import NON_LAYER_ROW, Cell, SparsityGrid, kind_of, sparsity

__all__ = ["NON_LAYER_ROW", "Cell", "SparsityGrid", "dense_bytes", "kind_of", "raw_bytes", "sparsity"]
