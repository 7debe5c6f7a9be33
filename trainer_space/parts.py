"""What a GRPO run trains and publishes with, loaded: the model, its weights resumed from the bucket, the
publisher, the payload log, the publish callback and the rollout function.

Building `TrainerParts` does all the loading, in the calling thread, and blocks meanwhile: seconds for a
small model on a CPU, minutes for a big one on a GPU. `TrainingSession` builds it in its training thread
(or in `load`), so its server and UI answer while a model loads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

import delta
from wire.budget import budget_for
from wire.history import up_to
from wire.lora import LoraSettings
from wire.trainer import TrainerHistory

from .config import TrainerConfig
from .fleet import FleetRollouts, FleetRun
from .keys import TrainerKeys
from .lora import LoraRefusedError, check_targets, load_adapter, lora_master, lora_settings, stored_adapter, wrapped
from .payload import dense_bytes
from .publishing import PayloadLog, PublishCallback, VersionPublisher
from .ranks import TrainerRanks
from .rollouts import RolloutSource, WordleRollouts
from .weights import cast_into, master_tensors, published_state, resume

logger = logging.getLogger(__name__)


class TrainerParts:
    """The loaded model and everything built around it, kept across a session's runs.

    Args:
        config: Settings (model folder, device, bucket, publishing, rollout sampling).
        client: Plays the games in request mode (the rollout Space's client, or a stand-in); None in a fleet.
        stop: Set when the session stops: ends the rollout function's wait between retries, or for groups.
        fleet: The fleet's run (a fleet: `config.rollout_url` is None).
        wrap_publisher: Wraps the publisher that `callback` calls after each step (a benchmark publishing
            on a schedule); `close` still closes the publisher itself. None: the callback calls it directly.
            Not called when publishing is off.
        ranks: The trainer's ranks (`torchrun`, `ranks.TrainerRanks`): each rank publishes its own share of
            the weights over their gloo group, and takes its games through rank 0; the payload log runs on
            rank 0 only. Several ranks need the fleet; a LoRA run's ranks each publish their share of the adapter
            or of the merged weights. Default: one rank.
        history: What the trainer processes before this one recorded (`history.HistoryKeeper.load`): the payload
            log starts from its payloads and anchors, up to the version resumed.
        keys: Rank 0's keys (`keys.TrainerKeys`, every rank's): the versions resumed are those they signed. None: rank
            0's `delta.trainer_key`, handing over from none.
        handover_from: Rank 0: the key its key replaces (`keys.load_keys`), given to the publisher, which signs the
            trainer's versions again with the new key and commits the handover (None: none).

    Attributes:
        tokenizer: The model folder's tokenizer.
        model: The model, loaded as fp32 on `config.device`; the optimizer trains it.
        resumed_from: The bucket version loaded (None: the bucket was empty; the weights are the folder's).
        resumed_hash: The hash of the bucket's version as the reader verified it while loading it into
            `published` (the manifest's; None likewise).
        publisher: Publishes to `config.bucket` in its own thread (None: `config.publish` is off).
        payloads: Measures each committed delta, in its own thread (None likewise).
        callback: Casts `master` into `published` and publishes it at the end of every optimizer step.
        rollouts: GRPOTrainer's `rollout_func`: `WordleRollouts` (request mode) or `FleetRollouts`.
        lora: The run's LoRA settings, written into the run's settings (None: every weight trains). The model stays
            the plain model until the session's first GRPOTrainer wraps it with PEFT (`peft_config`); `model` is then
            the PEFT model, which later runs train on. An adapter run resumed from the bucket loads the bucket's adapter
            into it then (`lora.stored_adapter`, `lora.load_adapter`); `resumed_from` and `resumed_hash` are set here.

    Raises:
        OSError, ValueError: the model folder cannot be loaded, or its tensors' names are not the model's.
        delta.StateMismatchError: the bucket holds another model.
        ValueError: a LoRA run whose targets are not linear layers of the model (`lora.check_targets`), on a bucket it
            cannot resume (`lora.stored_adapter` says why); a run of every weight on a bucket of
            an adapter run's versions (`lora.LoraRefusedError`).
        delta.DeltaError: the bucket cannot be read.
    """

    def __init__(
        self,
        config: TrainerConfig,
        client: RolloutSource | None,
        stop: threading.Event,
        wrap_publisher: Callable[[delta.Publisher], VersionPublisher] | None = None,
        fleet: FleetRun | None = None,
        ranks: TrainerRanks | None = None,
        history: TrainerHistory | None = None,
        keys: TrainerKeys | None = None,
        handover_from: delta.SigningKey | None = None,
    ) -> None:
        c = self.config = config
        ranks = ranks or TrainerRanks()
        if ranks.world > 1 and fleet is None:
            raise ValueError(f"{ranks.world} ranks train on games from the fleet only: leave --rollout-url unset")
        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(c.model, local_files_only=True)
        # fp32 master weights, whatever the checkpoint's dtype; the published state is their cast to it.
        self.model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
            c.model, dtype=torch.float32, local_files_only=True
        )
        self.model.to(c.device)  # type: ignore[arg-type]  # transformers' decorated `to` types its first argument as the model
        master = master_tensors(self.model, c.model)
        published = published_state(master, c.model)
        #: The run's LoRA settings (None: every weight trains); the base's hash is that of the folder's tensors.
        self.lora: LoraSettings | None = None
        #: A resumed adapter, loaded into the PEFT model when the first run wraps it (`_master_of`).
        self._stored_adapter: dict[str, torch.Tensor] | None = None
        # The run before this one, as rank 0 read it: another rank may read the bucket after rank 0 wrote this run's.
        previous = ranks.broadcast(fleet.previous_lora if fleet is not None else None)
        # The versions it resumes are those its key signed: rank 0's, which signs them (`delta.Publisher`), or, before
        # its first, the key it hands over from.
        if keys is None:
            keys = TrainerKeys(
                ranks.broadcast(delta.trainer_key(delta.open_storage(c.bucket).url).public.text if ranks.main else None)
            )
        own = keys.trust(c.bucket)
        if c.lora:
            check_targets(self.model, c.lora_targets)
            self.lora = lora_settings(c, delta.state_digest(published).hexdigest)
            version, verified, self._stored_adapter = stored_adapter(c.bucket, self.lora, previous, own)
        else:
            try:
                version, verified = resume(published, c.bucket, own)
            except delta.StateMismatchError as e:
                if previous is None or previous.sync != "adapter":
                    raise
                raise LoraRefusedError(
                    f"bucket {c.bucket} holds the versions of a LoRA adapter run (r {previous.r}, "
                    "adapter mode), which a run of every weight cannot resume; use a new bucket, "
                    "or the adapter run's --lora-* flags"
                ) from e
        self.resumed_from: int | None = None
        self.resumed_hash: str | None = None
        if version:
            if self.lora is None:
                cast_into(master, published)
            self.resumed_from, self.resumed_hash = version, verified
        self.publisher: delta.Publisher | None = None
        self.payloads: PayloadLog | None = None
        if c.publish:
            budget = budget_for(c.bucket)  # a Hub bucket: at most one version every `publish_s` (wire.budget)
            pconfig = delta.PublisherConfig(
                anchor_every=c.anchor_every, codec=c.codec or delta.DEFAULT_CODEC, min_interval=budget.publish_s
            )
            base = published if version and ranks.world == 1 else None  # several ranks: each reads its own
            if self.lora is not None:
                base = self._stored_adapter  # an adapter run resumed: the adapter; else nothing stored
            self.publisher = delta.Publisher(
                c.bucket, pconfig, handover_from=handover_from, base_state=base, group=ranks.group
            )
            if ranks.main:
                key = self.publisher.public_key
                assert key is not None  # rank 0's, which signs
                logger.info(
                    "signing the versions and run settings of %s with %s (readers: --trusted-key %s)",
                    c.bucket,
                    key.fingerprint,
                    key.text,
                )
                earlier = up_to(history, version) if history is not None else None
                self.payloads = PayloadLog(
                    c.bucket,
                    dense_bytes(published),
                    budget.poll_s,
                    earlier=earlier,
                    trust=own,
                    max_age=budget.listing_age_s,
                    idle_max=budget.idle_poll_s,
                ).start()
        sink = wrap_publisher(self.publisher) if wrap_publisher and self.publisher is not None else self.publisher
        self.callback = PublishCallback(
            sink, published, version, master=master, rank=ranks.rank, world=ranks.world, master_of=self._master_of
        )
        self.rollouts: WordleRollouts | FleetRollouts
        if fleet is not None:
            fleet.know_lora(self.lora)
            fleet.know_vocabulary(self.model.get_input_embeddings().num_embeddings)  # type: ignore[arg-type]  # an nn.Embedding's
            self.rollouts = FleetRollouts(c, fleet, lambda: self.callback.version, stop, ranks, self.tokenizer)
        elif client is not None:
            self.rollouts = WordleRollouts(c, client, lambda: self.callback.version, stop)
        else:
            raise ValueError("request mode needs a rollout client (config.rollout_url), a fleet its bucket and run")

    def _master_of(self, model: torch.nn.Module) -> Mapping[str, torch.Tensor]:
        """The master tensors of the model a run trains (see `PublishCallback`'s `master_of`): the checkpoint's
        tensors, or in a LoRA run (TRL wrapped the model with PEFT) `lora.lora_master`."""
        if self.lora is None:
            return master_tensors(model, self.config.model)
        master = lora_master(model, self.config.model, self.lora.sync)
        if self._stored_adapter is not None:  # resumed: the bucket's adapter into the PEFT model, bit for bit
            load_adapter(master, self._stored_adapter)
            self._stored_adapter = None
        if self.lora.sync == "adapter" and self.payloads is not None:  # the dense figure is the adapter's
            self.payloads.dense_bytes = sum(t.numel() * t.element_size() for t in master.values())
        return master

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
        """The last version committed to the bucket (0 before any); without a publisher, the version the
        weights are at."""
        if self.publisher is None:
            return self.callback.version
        return self.publisher.last.version if self.publisher.last is not None else 0

    @property
    def state_hash(self) -> str | None:
        """The hash of the last committed version (None before any, or without a publisher)."""
        last = self.publisher.last if self.publisher is not None else None
        return last.state_hash if last is not None else None

    def close(self, timeout: float | None = None) -> bool:
        """Flush the last version to the bucket and stop the publisher's and the payload log's threads, within
        `timeout` seconds in all (None: as long as the flush takes); True if that version was committed (or nothing
        was to be)."""
        end = None if timeout is None else time.monotonic() + timeout
        try:
            return self.publisher.close(timeout) if self.publisher is not None else True
        finally:
            if self.payloads is not None:
                self.payloads.close(5.0 if end is None else max(0.0, end - time.monotonic()))
