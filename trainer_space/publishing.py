"""Publishing after every optimizer step, and measuring what each published version cost.

`PublishCallback` casts the master weights into the published state and hands it to `delta.Publisher` at the end
of every optimizer step (a step waits only for the copy). `PayloadLog` records, per committed delta, its size
against the `raw` layout's (int32 positions + values) and the dense model's."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import torch
from transformers import TrainerCallback

import delta
from delta import PublishedVersion
from fleet.periodic import Periodic
from wire.trainer import Anchor, Payload, TrainerHistory

from .payload import raw_bytes
from .weights import cast_into

logger = logging.getLogger(__name__)


class VersionPublisher(Protocol):
    """What `PublishCallback` publishes through: a `delta.Publisher`, or a wrapper of one (a benchmark's
    schedule, see `TrainingSession`'s `wrap_publisher`)."""

    @property
    def last(self) -> PublishedVersion | None: ...

    @property
    def state_version(self) -> int: ...

    def publish(self, state: Mapping[str, torch.Tensor | delta.pieces.Slice]) -> None: ...

    def flush(self, timeout: float | None = None) -> bool: ...


class PublishCallback(TrainerCallback):
    """Publishes `state` as the next version at the end of every optimizer step.

    Args:
        publisher: Where versions go (None: count versions without publishing, for benchmarks).
        state: The published tensors (see `weights.published_state`).
        version: The version `state` holds now (the bucket's latest on resume, else 0).
        master: The weights the optimizer updates, cast into `state` before each publish (None: shared already).
        rank, world: Several ranks that each hold the whole model publish their `delta.pieces.split` share; ranks
            holding shards (FSDP2 `DTensor`s) publish their local shards, no gather.
        master_of: The master weights of the model a run trains, called when each run begins (accelerate and FSDP2
            hand the trainer new or sharded tensors; a LoRA run trains `lora.lora_master`). None: `master` stays.

    Attributes:
        copy_s: Seconds the last publish blocked the step (the cast and the snapshot copy).
        steps: Steps seen.
    """

    def __init__(
        self,
        publisher: VersionPublisher | None,
        state: dict[str, torch.Tensor],
        version: int,
        master: Mapping[str, torch.Tensor] | None = None,
        rank: int = 0,
        world: int = 1,
        master_of: Callable[[torch.nn.Module], Mapping[str, torch.Tensor]] | None = None,
    ) -> None:
        self.publisher = publisher
        self.state = state
        self.master = master
        self.rank, self.world = rank, world
        self.master_of = master_of
        self.start_version = version
        self.steps = 0
        self.copy_s = 0.0

    @property
    def version(self) -> int:
        """The version the trainer's weights are at, in the bucket's numbering (versions count commits, not steps;
        without a publisher, the start version plus the steps)."""
        if self.publisher is None:
            return self.start_version + self.steps
        return self.publisher.state_version

    def share(self) -> Mapping[str, torch.Tensor | delta.pieces.Slice]:
        """What this rank publishes of `state`: all of it (one rank, or FSDP2 shards, which `delta` publishes
        as each rank's local slices), or its `delta.pieces.split` share of a state every rank holds whole."""
        if self.world == 1 or _sharded(self.state):
            return self.state
        return delta.pieces.split(self.state, self.rank, self.world)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.master_of is not None and model is not None:
            self.master = self.master_of(model)
            if set(self.master) != set(self.state):  # a LoRA run in adapter mode: the adapter (its shards) goes out
                self.state = {n: t.detach().clone() for n, t in self.master.items()}
            elif _sharded(self.master) and not _sharded(self.state):  # FSDP2 sharded the model: publish shards
                self.state = {n: t.to(self.state[n].dtype, copy=True) for n, t in self.master.items()}
        return control

    def on_step_end(self, args, state, control, **kwargs):
        start = time.perf_counter()
        if self.master is not None:
            cast_into(self.state, self.master)
        if self.publisher is not None:
            self.publisher.publish(self.share())
        self.copy_s = time.perf_counter() - start
        self.steps += 1
        return control


def _sharded(state: Mapping[str, torch.Tensor]) -> bool:
    """Whether `state` holds `DTensor`s (an FSDP2 model's weights), which each rank holds a slice of."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(t, DTensor) for t in state.values())


class PayloadLog:
    """Follows a bucket's manifest in a daemon thread and measures each new delta from its header alone.

    Args:
        bucket: The trainer's bucket: its budget sets the polls, its trust which versions are measured.
        dense_bytes: Bytes of the full published state.
        history: Most payloads (and anchors) kept.
        earlier: What earlier trainer processes measured: kept first.

    Attributes:
        on_record: Called (from its thread) after each version measured: the session writes the history then.
    """

    def __init__(
        self, bucket: delta.Bucket, dense_bytes: int, history: int = 10_000, earlier: TrainerHistory | None = None
    ) -> None:
        self.bucket = bucket
        self.dense_bytes = dense_bytes
        self.history = history
        self.records: list[Payload] = list(earlier.payloads) if earlier is not None else []
        #: The versions committed with a full copy (anchor), such as the first one.
        self.anchors: list[Anchor] = list(earlier.anchors) if earlier is not None else []
        self.on_record: Callable[[], None] | None = None
        self.latest_header: delta.DeltaHeader | None = None
        self._seen = 0
        budget = bucket.budget
        self._reader = Periodic(self._poll_logged, budget.poll_s, "payload-log", idle_max=budget.idle_poll_s)

    def start(self) -> PayloadLog:
        """Start polling; versions from the bucket's newest on are measured (a newest one `earlier` measured gives the
        heatmap its header only)."""
        manifest = delta.read_manifest(self.bucket)
        latest = manifest.latest if manifest is not None else None
        known = max([p.version for p in self.records] + [a.version for a in self.anchors], default=0)
        self._seen = 0 if latest is None else latest.version if known >= latest.version else latest.version - 1
        if latest is not None and known >= latest.version and latest.delta:
            try:
                self.latest_header = delta.DeltaHeader.merged(self._headers(latest))
            except (delta.DeltaError, OSError) as e:  # retention may delete a file first
                logger.warning("payload log: %s", e)
        self._reader.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop polling, after one last poll: a version committed as the trainer stopped is measured too. Waits up
        to `timeout` seconds for a poll in flight; past that, the thread (a daemon) is left and no last poll made."""
        if self._reader.close(timeout):
            with contextlib.suppress(delta.DeltaError, OSError):  # logged
                self._poll_logged()

    def _poll_logged(self) -> bool:
        """`poll`, its failure logged (and raised: the thread's next poll waits longer, `fleet.periodic`)."""
        try:
            return self.poll()
        except (delta.DeltaError, OSError) as e:  # retention may delete a file first; try next poll
            logger.warning("payload log: %s", e)
            raise

    def poll(self) -> bool:
        """Measure the versions committed since the last poll (deltas only: anchors replace everything); whether
        there was one."""
        seen = self._seen
        manifest = delta.read_manifest(self.bucket, max_age=self.bucket.budget.listing_age_s)
        if manifest is None:
            return False
        for entry in manifest.versions:
            if entry.version <= self._seen:
                continue
            try:
                self.bucket.trust.check_version(entry, manifest)
            except delta.UntrustedVersionError:  # someone else's: the trainer's own of that number comes later
                break
            self._seen = entry.version
            if entry.anchor:
                self.anchors.append(
                    Anchor(version=entry.version, bytes=sum(f.size for f in entry.anchor), at=time.time())
                )
                del self.anchors[: -self.history]
            if entry.delta:
                self._measure(entry)
            if self.on_record is not None:
                self.on_record()
        return self._seen != seen

    def _headers(self, entry: delta.VersionEntry) -> list[delta.DeltaHeader]:
        return [
            delta.read_delta(self.bucket.read(f.path, max_bytes=f.size, listed=self._listed(f)), f.path)[0]
            for f in entry.delta
        ]

    def _listed(self, ref: delta.FileRef) -> delta.StoredFile | None:
        """The file's entry in the process's listing (the publisher put it there as it wrote it), if its size is the
        manifest's: read by it, nothing more is asked of the bucket."""
        listed = self.bucket.listed(ref.path)
        return listed if listed is not None and listed.size == ref.size else None

    def _measure(self, entry: delta.VersionEntry) -> None:
        """Record what the delta of a committed version cost, from its files' headers."""
        headers = self._headers(entry)
        self.records.append(
            Payload(
                version=entry.version,
                delta_bytes=sum(f.size for f in entry.delta),
                raw_bytes=sum(raw_bytes(h) for h in headers),
                dense_bytes=self.dense_bytes,
                changed=sum(h.changed for h in headers),
                total=headers[0].total,
                at=time.time(),
            )
        )
        del self.records[: -self.history]
        self.latest_header = delta.DeltaHeader.merged(headers)
