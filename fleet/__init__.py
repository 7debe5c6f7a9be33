"""The fleet's protocol through the bucket: the trainer and its rollout servers, coordinated by files beside the
weights and never by a direct connection (docs/fleet.md).

Built on the role's `delta.Bucket` (its shared listing, its traffic, its trust, its budget) and on the messages of
`wire` (what the files hold, checked as a stranger's); it imports no app.

- `fleet.bucket`: the run's settings, game groups and heartbeats (`FleetBucket`).
- `fleet.liveness`: which servers are alive, by their heartbeats.
- `fleet.exams`: the exam records (``exams/``).
- `fleet.history`: the trainer's history file, read back by the trainer that starts next.
- `fleet.periodic`: a bucket read repeated in a thread, at the bucket's budget.
"""
