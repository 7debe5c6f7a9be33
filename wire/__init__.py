"""What crosses between the apps and is not the weights: the messages both sides import, so no app imports
another. It imports no app and no drawing code (``dashboard``).

- `wire.wordle`: the game every player shares: board size, scoring, the marks' codes, the ``<guess>`` tags.
- `wire.env`, `wire.rollout`, `wire.trainer`: what each app's HTTP API takes and answers.
- `wire.errors`: the errors a client of the rollout API raises (`webguard.calls` makes the request).
- `wire.trajectory`: one whole game as a GRPO sample (the rollout's answer, the fleet's groups).
- `wire.fleet`: the run settings, game groups and heartbeats the trainer and the rollout servers
  exchange through the bucket, and their checked file form; `fleet.bucket` reads and writes them;
  `fleet.liveness` tells a live server from a silent one by its heartbeats.
- `wire.curriculum`: the schedule by which training games show the env's example words (examples that fade).
- `wire.exam`: the exam's settings, scores and record; `fleet.exams` reads and writes the records in the
  bucket (``exams/``).
"""
