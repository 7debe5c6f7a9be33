"""The drawing shared by the three apps' UIs: delta sparsity per layer and tensor kind, plotly figures
(``dashboard.figures``), the Wordle board, keyboard, feed and CSS (``dashboard.render``), Wordle boards of policy
trajectories (``dashboard.games``), texts about training progress (``dashboard.trend``), the exam's curves and
texts (``dashboard.exam``), the words the public
pages share (``dashboard.labels``: counts, locations safe to show, the glossary) and how a UI is mounted on its
API (``dashboard.mount``). (Matches against the policy are the rollout's: ``rollout_space.versus``.)

They only draw: pure functions of data the apps already hold (the messages of ``wire``), so they are unit-tested
without Gradio and reused by every UI; ``dashboard`` imports no app. Only ``mount`` imports Gradio; ``plotly`` is
imported by ``figures``, and by ``exam``'s figure when it is drawn.
"""

from .sparsity import NON_LAYER_ROW, Cell, SparsityGrid, kind_of, sparsity

__all__ = ["NON_LAYER_ROW", "Cell", "SparsityGrid", "kind_of", "sparsity"]
