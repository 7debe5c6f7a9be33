"""What a GRPO run trains and publishes with: the model, its weights resumed from the bucket, the publisher, the
payload log, the publish callback and the rollout function. `load_parts` loads them in the calling thread (seconds
to minutes); `TrainingSession` calls it in its training thread, so its server and UI answer meanwhile."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

import delta
from wire.history import up_to
from wire.lora import LoraSettings
from wire.trainer import TrainerHistory

from .config import TrainerConfig
from .fleet import FleetRollouts, FleetRun
from .lora import LoraRefusedError, check_targets, load_adapter, lora_master, lora_settings, stored_adapter, wrapped
from .payload import dense_bytes
from .publishing import PayloadLog, PublishCallback
from .ranks import TrainerRanks
from .rollouts import RolloutSource, WordleRollouts
from .weights import cast_into, master_tensors, published_state, pull_into

if TYPE_CHECKING:
    from .session import PublisherWrapper

logger = logging.getLogger(__name__)


@dataclass
class TrainerParts:
    """The loaded model and everything built around it, kept across a session's runs (`load_parts`).

    Attributes:
        config: The session's settings.
        tokenizer: The model folder's tokenizer.
        model: The model, fp32 on `config.device` (in a LoRA run, the PEFT model once TRL wrapped it).
        lora: The run's LoRA settings (None: every weight trains).
        resumed_from, resumed_hash: The bucket version loaded and its state hash (None: none of this trainer's).
        publisher: Publishes to the bucket in its own thread (None: `config.publish` is off).
        payloads: Measures each committed delta (rank 0; None without a publisher).
        callback: Publishes the master weights at the end of every step.
        rollouts: GRPOTrainer's `rollout_func`: `WordleRollouts` (request mode) or `FleetRollouts`.
    """

    config: TrainerConfig
    tokenizer: PreTrainedTokenizerBase
    model: PreTrainedModel
    lora: LoraSettings | None
    resumed_from: int | None
    resumed_hash: str | None
    publisher: delta.Publisher | None
    payloads: PayloadLog | None
    callback: PublishCallback
    rollouts: WordleRollouts | FleetRollouts

    @property
    def master(self) -> Mapping[str, torch.Tensor]:
        """The trained model's parameters under the checkpoint's names, sharing their storage (the fp32 master
        weights): the callback's, which it takes again from the model TRL trains when a run begins."""
        assert self.callback.master is not None  # the callback casts from master weights
        return self.callback.master

    @property
    def published(self) -> dict[str, torch.Tensor]:
        """The master weights' cast to the checkpoint's dtypes: what goes to the bucket (`weights.published_state`);
        the callback's, which under FSDP2 becomes the cast of each rank's shards when a run begins."""
        return self.callback.state

    @property
    def parameters(self) -> int:
        """Parameters of the model trained (a LoRA run's adapter included once PEFT wrapped the model)."""
        return sum(p.numel() for p in self.model.parameters())

    @property
    def trainable(self) -> int | None:
        """Parameters the optimizer trains: the adapter's in a LoRA run (None until the first run wrapped the model
        with PEFT), else every one."""
        if self.lora is not None and not wrapped(self.model):
            return None
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    @property
    def version(self) -> int:
        """The last version committed to the bucket (0 before any); without a publisher, the version the weights
        are at."""
        if self.publisher is None:
            return self.callback.version
        return self.publisher.last.version if self.publisher.last is not None else 0

    @property
    def state_hash(self) -> str | None:
        """The hash of the last committed version (None before any, or without a publisher)."""
        last = self.publisher.last if self.publisher is not None else None
        return last.state_hash if last is not None else None

    def close(self, timeout: float | None = None) -> bool:
        """Flush the last version and stop the publisher's and the payload log's threads within `timeout` seconds (None:
        as long as the flush takes); True if that version was committed (or nothing was to be)."""
        end = None if timeout is None else time.monotonic() + timeout
        try:
            return self.publisher.close(timeout) if self.publisher is not None else True
        finally:
            if self.payloads is not None:
                self.payloads.close(5.0 if end is None else max(0.0, end - time.monotonic()))


@dataclass
class MasterOf:
    """The master tensors of the model a run trains (`PublishCallback.master_of`): the checkpoint's tensors, or in a
    LoRA run `lora.lora_master`, into which the `stored` adapter resumed from the bucket is loaded once."""

    folder: str
    lora: LoraSettings | None
    stored: dict[str, torch.Tensor] | None
    payloads: PayloadLog | None

    def __call__(self, model: torch.nn.Module) -> Mapping[str, torch.Tensor]:
        if self.lora is None:
            return master_tensors(model, self.folder)
        master = lora_master(model, self.folder, self.lora.sync)
        if self.stored is not None:
            load_adapter(master, self.stored)
            self.stored = None
        if self.lora.sync == "adapter" and self.payloads is not None:
            self.payloads.dense_bytes = sum(t.numel() * t.element_size() for t in master.values())
        return master


def load_parts(
    config: TrainerConfig,
    bucket: delta.Bucket,
    *,
    ranks: TrainerRanks,
    fleet: FleetRun | None,
    client: RolloutSource | None,
    stop: threading.Event,
    history: TrainerHistory | None = None,
    wrap_publisher: PublisherWrapper | None = None,
) -> TrainerParts:
    """Load the model, resume its weights from the bucket (`delta.Bucket.resume`), and build the publisher, the payload
    log, the publish callback and the rollout function (`TrainerParts`). Several `ranks` each publish their share;
    `fleet` None: request mode, games from `client`; `history`: what earlier trainer processes recorded.

    Raises:
        OSError, ValueError: the model folder cannot be loaded, or its tensors' names are not the model's.
        delta.StateMismatchError: the bucket holds another model.
        LoraRefusedError, ValueError: a LoRA run the bucket's versions do not fit.
        delta.DeltaError: the bucket cannot be read.
    """
    c = config
    if ranks.world > 1 and fleet is None:
        raise ValueError(f"{ranks.world} ranks train on games from the fleet only: leave --rollout-url unset")
    if fleet is None and client is None:
        raise ValueError("request mode needs a rollout client (config.rollout_url), a fleet its bucket and run")
    tokenizer = AutoTokenizer.from_pretrained(c.model, local_files_only=True)
    # fp32 master weights, whatever the checkpoint's dtype; the published state is their cast to it.
    model = AutoModelForCausalLM.from_pretrained(c.model, dtype=torch.float32, local_files_only=True)
    model.to(c.device)  # type: ignore[arg-type]  # transformers' decorated `to` types its first argument as the model
    master = master_tensors(model, c.model)
    published = published_state(master, c.model)
    resume = ranks.broadcast(bucket.resume() if ranks.main else None)  # found once, by rank 0: what its key signed
    previous = ranks.broadcast(fleet.previous_lora if fleet is not None else None)  # as rank 0 read it
    lora, stored, version, verified = None, None, 0, None
    if c.lora:
        check_targets(model, c.lora_targets)
        lora = lora_settings(c, delta.state_digest(published).hexdigest)
        stored = stored_adapter(bucket, resume.newest, resume.version, lora, previous, resume.manifest)
        if stored is not None:
            version, verified = resume.version, delta.state_digest(stored).hexdigest
    elif resume.version:
        try:
            version, verified = resume.version, pull_into(published, bucket, resume.version, resume.manifest)
        except delta.StateMismatchError as e:
            if previous is None or previous.sync != "adapter":
                raise
            raise LoraRefusedError(
                f"bucket {c.bucket} holds the versions of a LoRA adapter run (r {previous.r}, adapter mode), which a "
                "run of every weight cannot resume; use a new bucket, or the adapter run's --lora-* flags"
            ) from e
        cast_into(master, published)
    publisher = payloads = None
    if c.publish:
        config_ = delta.PublisherConfig(anchor_every=c.anchor_every, codec=c.codec or delta.DEFAULT_CODEC)
        base = stored if lora is not None else published if version and ranks.world == 1 else None
        publisher = delta.Publisher(bucket, config_, base_state=base, group=ranks.group).start()
        if ranks.main:
            key = bucket.signing_key.public
            logger.info(
                "signing the versions and run settings of %s with %s (readers: --trusted-key %s)",
                c.bucket,
                key.fingerprint,
                key.text,
            )
            earlier = up_to(history, version) if history is not None else None
            payloads = PayloadLog(bucket, dense_bytes(published), earlier=earlier).start()
    sink = wrap_publisher(publisher) if wrap_publisher and publisher is not None else publisher
    master_of = MasterOf(c.model, lora, stored, payloads)
    callback = PublishCallback(
        sink, published, version, master=master, rank=ranks.rank, world=ranks.world, master_of=master_of
    )
    rollouts: WordleRollouts | FleetRollouts
    if fleet is not None:
        fleet.know_lora(lora)
        fleet.know_vocabulary(model.get_input_embeddings().num_embeddings)  # type: ignore[arg-type]  # an nn.Embedding's
        rollouts = FleetRollouts(c, fleet, lambda: callback.version, stop, ranks, tokenizer)
    else:
        assert client is not None  # checked above
        rollouts = WordleRollouts(c, client, lambda: callback.version, stop)
    return TrainerParts(c, tokenizer, model, lora, version or None, verified, publisher, payloads, callback, rollouts)
