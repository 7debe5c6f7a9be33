"""For a rollout server that plays no games for the fleet (`--no-produce`): the run's settings still say which state
the bucket holds (a LoRA run's adapter, or full weights), so a daemon thread reads them and has the follower follow
that state (`follower.Follower.adopt`), as the producer does before each batch on a server that plays."""

from __future__ import annotations

import logging
from collections.abc import Callable

from delta import StorageError
from fleet.bucket import FleetBucket
from fleet.periodic import Periodic
from wire.errors import RolloutError
from wire.fleet import FleetMessageError
from wire.lora import LoraSettings

logger = logging.getLogger(__name__)


class RunWatch:
    """Reads ``fleet/run.json`` every `interval` seconds and hands its LoRA settings to `adopt`.

    Args:
        bucket: The fleet's bucket (with the rollout token when the run signs its files).
        adopt: Called with `RunSettings.lora` (None: full weights) and the versions to keep (the run's staleness + 1)
            at each read of a run's settings; what it raises (`LoraRefusedError`) is logged once per message, and
            tried again at the next read.
        interval: Seconds between reads.

    Attributes:
        last_error: The last failure (an unreadable bucket or run file, a refused run), None once a read succeeds.
    """

    def __init__(
        self, bucket: FleetBucket, adopt: Callable[[LoraSettings | None, int], object], interval: float = 1.0
    ) -> None:
        self.bucket = bucket
        self.adopt = adopt
        self.interval = interval
        self.last_error: str | None = None
        self._reader = Periodic(self._read, interval, "run-watch")

    def start(self) -> RunWatch:
        self._reader.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop reading; waits up to `timeout` s for a read (or a switch of the engine's state) in flight."""
        self._reader.close(timeout)

    def poll(self) -> None:
        """Read the run once and follow the state it names (raises what reading or `adopt` raises). No run's settings
        (none yet, or deleted) name nothing: the state followed stays, as on a server that plays."""
        run = self.bucket.read_run()
        if run is not None:
            self.adopt(run.lora, run.max_staleness + 1)

    def _read(self) -> None:
        """`poll`, its failures logged (once per message) and kept in `last_error`."""
        try:
            self.poll()
        except (OSError, StorageError, FleetMessageError, RolloutError) as e:
            if str(e) != self.last_error:
                logger.warning("not following the run's settings: %s", e)
            self.last_error = str(e)
            raise  # the next read waits longer (`fleet.periodic`)
        self.last_error = None
