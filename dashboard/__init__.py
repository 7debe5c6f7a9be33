"""Dashboard pieces shared by the rollout and trainer UIs: delta sparsity per layer and tensor kind,
plotly figures, Wordle boards of policy trajectories and the "play against the policy" match.

Pure functions of data the Spaces already hold, so they are unit-tested without Gradio and reused
by every UI. Nothing here imports Gradio; ``plotly`` is imported by ``figures`` only.
"""

from .sparsity import NON_LAYER_ROW, Cell, SparsityGrid, kind_of, sparsity

__all__ = ["NON_LAYER_ROW", "Cell", "SparsityGrid", "kind_of", "sparsity"]
