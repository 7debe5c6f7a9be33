"""How often the apps read and write their bucket: every interval of the fleet's traffic, chosen once per kind of
bucket from what its requests cost.

On a Hugging Face bucket every request counts against the account's quota per 5-minute window (a free account:
1,000 API-class requests, listings, paths-info, batch calls and Xet tokens alike), shared by every Space of the
account. There the apps poll less often while nothing changes, share one listing of the bucket per poll among all
the readers of a process (`delta.Storage.list`'s `max_age`), beat less often, and read nothing that did not change;
docs/fleet.md ("Requests against the Hub's limits") derives what a trainer and N rollout servers then cost,
measured by `python -m bench.hub_requests`. A local folder costs nothing per request, and S3 a fraction of a cent per
thousand: there the apps keep the quick intervals that make a run on one machine (and the tests) react at once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    """The intervals of one bucket's traffic (seconds).

    Attributes:
        poll_s: Between two looks of a poller while something comes (a new version, a group).
        idle_poll_s: Longest wait between two looks while nothing comes (looks that find nothing double the wait
            from `poll_s`; the first change brings it back).
        listing_age_s: How old the process's shared listing of the bucket may be for the fleet's pollers (run
            settings, groups, heartbeats, exams) to answer from it.
        group_wait_s: Longest wait between two looks of a trainer waiting for game groups.
        heartbeat_s: Between two heartbeats of a rollout server.
        whole_shares: A rollout server plays its whole share of a step whenever the bucket has room, in one write,
            not its share of the room left, which comes a group or two at a time (`GroupProducer.whole_shares`).
        beat_on_version: One more heartbeat whenever the version a server serves changes (the trainer's fleet table
            shows it at once).
        gone_after_s: A server whose heartbeat has not counted up for this long is gone.
        monitor_s: Between two reads of the heartbeats by the trainer's fleet table.
        exams_s: Between two reads of the exam records by the trainer.
        history_s: Between two writes of the trainer's history (changes in between are folded into one).
        publish_s: Between two versions at least (`delta.PublisherConfig.min_interval`): a trainer that steps faster
            publishes the newest of its steps when it is due (they coalesce into one delta).
    """

    poll_s: float
    idle_poll_s: float
    listing_age_s: float
    group_wait_s: float
    heartbeat_s: float
    whole_shares: bool
    beat_on_version: bool
    gone_after_s: float
    monitor_s: float
    exams_s: float
    history_s: float
    publish_s: float


#: A local folder or S3: requests cost nothing to speak of; everything as soon as it comes.
QUICK = Budget(
    poll_s=1.0,
    idle_poll_s=1.0,
    listing_age_s=0.0,
    group_wait_s=0.5,
    heartbeat_s=5.0,
    whole_shares=False,
    beat_on_version=True,
    gone_after_s=30.0,
    monitor_s=2.0,
    exams_s=5.0,
    history_s=2.0,
    publish_s=0.0,
)
#: A Hugging Face bucket: a trainer and four rollout servers at the demo's cadence under half of a free account's
#: 1,000 API requests per 5 minutes (docs/fleet.md).
HUB = Budget(
    poll_s=2.0,
    idle_poll_s=24.0,
    listing_age_s=10.0,
    group_wait_s=5.0,
    heartbeat_s=30.0,
    whole_shares=True,
    beat_on_version=False,
    gone_after_s=90.0,
    monitor_s=15.0,
    exams_s=30.0,
    history_s=30.0,
    publish_s=15.0,
)


def budget_for(bucket: str) -> Budget:
    """The intervals for the bucket at URL `bucket`: `HUB` for `hf://`, else `QUICK`."""
    return HUB if bucket.startswith("hf://") else QUICK
