"""How often a bucket is read and written, chosen once per kind of bucket from what its requests cost.

On a Hugging Face bucket every request counts against the account's quota per 5-minute window (a free account:
1,000 API-class requests, listings, paths-info, batch calls and Xet tokens alike), shared by every Space of the
account: there readers look less often while nothing changes, share one listing of the bucket per poll (`Bucket.list`'s
`max_age`), the fleet beats less often, and the publisher commits at most one version per `publish_s`
(docs/fleet.md, "Requests against the Hub's limits"; `python -m bench.hub_requests` measures it). A local folder costs
nothing per request and S3 a fraction of a cent per thousand: there everything reacts at once. A `delta.Bucket` holds
its kind's budget; the library's defaults (`SubscriberConfig`, `PublisherConfig`, `delta follow`) and the apps' take
their intervals from it.
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
        listing_age_s: How old a shared listing of the bucket may be for the fleet's pollers to answer from it.
        publish_s: Between two versions at least (`PublisherConfig.min_interval`): a trainer that steps faster
            publishes the newest of its steps when it is due (they coalesce into one delta).
        group_wait_s: Longest wait between two looks of a trainer waiting for game groups.
        heartbeat_s: Between two heartbeats of a rollout server.
        whole_shares: A rollout server plays its whole share of a step whenever the bucket has room, in one write.
        beat_on_version: One more heartbeat whenever the version a server serves changes.
        gone_after_s: A server whose heartbeat has not counted up for this long is gone.
        monitor_s: Between two reads of the heartbeats by the trainer's fleet table.
        exams_s: Between two reads of the exam records by the trainer.
        history_s: Between two writes of the trainer's history (changes in between are folded into one).
    """

    poll_s: float
    idle_poll_s: float
    listing_age_s: float
    publish_s: float
    group_wait_s: float
    heartbeat_s: float
    whole_shares: bool
    beat_on_version: bool
    gone_after_s: float
    monitor_s: float
    exams_s: float
    history_s: float

    @staticmethod
    def of(url: str) -> Budget:
        """The budget of the bucket at `url`: `HUB` for `hf://`, else `QUICK`."""
        return HUB if url.startswith("hf://") else QUICK

    @property
    def version_interval(self) -> float | None:
        """What a reader waits after a new version before looking again: none comes sooner (None: no wait)."""
        return max(self.poll_s, self.publish_s) if self.publish_s else None


#: A local folder or S3: requests cost nothing to speak of; everything as soon as it comes.
QUICK = Budget(
    poll_s=1.0,
    idle_poll_s=1.0,
    listing_age_s=0.0,
    publish_s=0.0,
    group_wait_s=0.5,
    heartbeat_s=5.0,
    whole_shares=False,
    beat_on_version=True,
    gone_after_s=30.0,
    monitor_s=2.0,
    exams_s=5.0,
    history_s=2.0,
)
#: A Hugging Face bucket: a reader at rest looks about twice a minute; a trainer and four rollout servers at the
#: demo's cadence stay under half of a free account's 1,000 API requests per 5 minutes (docs/fleet.md).
HUB = Budget(
    poll_s=2.0,
    idle_poll_s=30.0,
    listing_age_s=10.0,
    publish_s=15.0,
    group_wait_s=5.0,
    heartbeat_s=30.0,
    whole_shares=True,
    beat_on_version=False,
    gone_after_s=90.0,
    monitor_s=15.0,
    exams_s=30.0,
    history_s=30.0,
)
