"""`delta` inside tools RL engineers already run. Each module imports its tool only when imported itself.

- `vllm_backend`: the vLLM weight-transfer backend `delta` (registered by the top-level `delta_vllm_plugin`,
  the package's `vllm.general_plugins` entry point).
- `trl`: `BucketWeightTransfer`, TRL AsyncGRPO's `weight_transfer=` over a `delta.Publisher`.
- `vllm_http`: a client for the weight-update routes of a `vllm serve` in dev mode (used by `delta follow`).
"""
