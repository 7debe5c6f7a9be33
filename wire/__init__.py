"""What crosses between the apps and is not the weights: messages that both sides import, so neither app
imports the other.

- `wire.trajectory`: one whole game as a GRPO sample (the rollout's answer, the fleet's groups).
- `wire.fleet`: the run settings, game groups and heartbeats the trainer and the rollout servers
  exchange through the bucket, and their checked file form; `wire.fleet_bucket` reads and writes them.
"""
