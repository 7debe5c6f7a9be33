"""The trainer's settings, one dataclass beside the trainer (as TRL keeps `GRPOConfig` beside `GRPOTrainer`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wire.curriculum import ExampleSchedule
from wire.exam import HELD_OUT_SECRETS, MAX_EXAM_TURNS, ExamSettings
from wire.lora import (
    DEFAULT_TARGETS,
    LORA_SYNCS,
    MAX_ADAPTER_RANK,
    MAX_RANK,
    LoraSync,
    check_target_names,
    kept_versions_refusal,
)
from wire.wordle import OPEN_TAG

from .credit import CREDITS, Credit


@dataclass(frozen=True)
class TrainerConfig:
    """Everything a training session needs; checked on construction.

    Attributes:
        bucket: Bucket URL the weights are published to and resumed from (local path, `s3://…`,
            `hf://buckets/ns/name`).
        rollout_url: Base URL of the one rollout Space asked for each step's games (request mode); None: the
            fleet, where any number of rollout servers play continuously and hand their games in through the
            bucket (`fleet.py`).
        model: Local model folder the trainer starts from when the bucket is empty (on resume the
            bucket's latest state is loaded into it; the folder gives the architecture and tokenizer).
        env_url: The env Space (shown in the UI; the rollout Space plays against its own env).
        games_per_step: Games (completions) per optimizer step, `groups_per_step * num_generations`.
        num_generations: Games per Wordle word: GRPO compares the games of one group, which share a seed.
        max_steps: Optimizer steps this session runs before it stops.
        learning_rate: AdamW learning rate. The optimizer updates fp32 master weights; a published (bf16)
            element changes once the updates since it last changed add up to half its ULP. 7e-5: the rate that
            moved SmolLM2-135M most within a 20-minute run on 2 CPU cores without breaking its replies (1e-4
            broke them, 5e-5 was slower; the runs: docs/benchmarks.md, docs/training.md).
        device: Torch device of the master weights, the optimizer state and the published state: `cpu` or
            `cuda`, the one GPU the process sees (`models.hardware.plan_trainer` turns `--device` into one, and
            refuses several GPUs or `cuda:N`: transformers' Trainer would move the model to cuda:0).
        bf16: Forward and backward passes under bf16 autocast (GPU only). `plan_trainer` sets it where the
            GPU has bf16 natively (compute 8.0+, such as an L4); elsewhere training runs in fp32, since torch
            emulates bf16 on a T4, slowly. The published weights keep the checkpoint's dtype either way.
        max_tokens: Tokens per model turn. 8 by default: opened with `<guess>` (the reply prefix), a guess and
            its closing tag take ~4 tokens and generation stops at `</guess>`; under the strict rule only the
            first word after the tag is scored, so tokens past it are prose that costs generation and
            backward time and is never scored (16 before the strict rule).
        max_game_tokens: Most tokens of one game, prompt and completion (fleet): the run's settings tell the rollout
            servers, which cut a game there; a group holding a longer game is refused. It bounds what one game
            costs the trainer's step (memory grows with it) and what one group file may weigh before it is read.
        max_turns: Guesses per game the policy plays in training (Wordle allows 6; the env records a game
            cut short as unfinished). 3 by default: each turn generates over the whole conversation
            again, so on a CPU a step of 6-turn games takes about twice as long.
        temperature: Sampling temperature of the rollouts.
        credit: What GRPO trains with which reward (`credit.py`). "move": each group on one move, drawn among
            the moves where its games scored differently, with that move's own reward. "game": every move of a
            game with the game's total, which reinforced the first move's copied example word (CRANE) as a
            repeat on the later moves too. In 20 minutes on 2 CPU cores, three seeds rose by +53, +10 and +21
            points of strict valid-guess rate with "move" (34 steps), +13, +39 and +21 with "game" (28 steps):
            the seeds differ more than the settings (docs/training.md).
        reply_prefix: Text that opens each of the policy's replies, written for it and never trained on
            (see `rollout_space.games.PlayParams`; default the guess's opening tag); "" lets the model write
            the whole reply.
        max_staleness: Most versions a game's oldest weights may lag the trainer's current version; older
            games are played again (`stale_retries` times, request mode) or dropped (fleet), and counted.
        max_pending_groups: Fleet back-pressure: the rollout servers stop producing while this many groups
            wait in the bucket; None: `groups_per_step * max(1, max_staleness - 1)`, what the staleness bound
            can use (a group waiting k steps is trained on about k + 1 versions after the weights that
            played it).
        importance_cap: Upper bound of a token's importance weight (current policy / sampler), as TRL's
            `vllm_importance_sampling_clip_max` (`offpolicy.py`).
        stale_retries: Rounds of replaying stale games in one step before the rest are dropped.
        stale_wait: Seconds to wait before replaying stale games (the rollout catches up meanwhile).
        publish: Publish a version after every step (off only for benchmarks).
        anchor_every: Full snapshot every this many versions (see `delta.PublisherConfig`).
        codec: Delta codec (`delta.CODECS`; None: the default).
        seed: Seed of the game order and of TRL's sampler.
        output_dir: Where TRL may write logs (nothing else is saved there: the bucket is the checkpoint).
        retry_wait: Seconds before retrying a rollout request that failed (the rollout or its env down or
            refusing); doubled after each failure in a row, up to `retry_max_wait`, with jitter
            (`delta.retry.RetryPolicy`). Training waits, it does not stop: the state stays `running`
            and `status()` shows the last error.
        retry_max_wait: Longest wait between two retries.
        rollout_token: The rollout Space's token (its `--token`), sent as a bearer token; None: none sent.
        examples: How likely a training game's messages show the env's example guess, by the weight version
            that starts it (`wire.curriculum.ExampleSchedule`): off, fixed (every message) or fading (default).
            Written into the run's settings (fleet) or sent with each request (request mode): the same rule
            for every player of the session.
        exam_every: An exam every this many versions, and one of version 0 (the untrained policy), played by a
            rollout server of the fleet on held-out secrets without examples (`wire.exam`); 0: no exams.
        exam_games: Held-out secrets an exam plays, one game each.
        exam_turns: Replies per exam game; None: `max_turns`, so exams read like the training games.
        exam_greedy: Exams sample greedily; by default they sample at `temperature`, the training's, with a fixed
            seed (every exam draws the same random numbers: two exams differ by the weights alone).
        kl: Weight of the KL divergence to the reference model (the model folder's weights) in GRPO's loss (TRL's
            `beta`): a guard against the policy drifting into degenerate replies. 0 (the default) loads no reference
            model; above 0 TRL loads one more copy of the model and runs it on every step's games.
        lora_r: Rank of a LoRA adapter to train instead of every weight (PEFT through TRL's `peft_config`); 0 (the
            default): no adapter. A LoRA run needs the fleet (the servers learn the adapter from the run's settings),
            one rank, and an empty bucket in merged mode; in adapter mode it resumes the bucket's adapter when the run
            before it had the same settings and base (`lora.stored_adapter`).
        lora_alpha: LoRA's alpha (updates scaled by alpha / r); None: 2 * lora_r.
        lora_targets: Names of the modules adapted; default every attention and MLP projection.
        lora_sync: How the adapter reaches the servers (`wire.lora`): "merged" publishes the base with the adapter
            merged in, in the checkpoint's dtype (the servers follow it as any state); "adapter" publishes the
            adapter's tensors alone (float32, PEFT's names), which the servers apply under PEFT.
        handover_from_file: A file of the user's holding the trainer's previous signing key, when its key now
            (``DELTA_SIGNING_KEY``, or the one kept for the bucket) replaces it: its text (``ed25519-private:...``) or
            a key file kept in ``~/.cache/delta/keys`` (`keys.py`). None: ``DELTA_HANDOVER_FROM`` (the key's text)
            when set, else no handover. Never the key itself: a private key must not show in ``ps``.
    """

    bucket: str
    rollout_url: str | None
    model: str
    env_url: str | None = None
    games_per_step: int = 8
    num_generations: int = 4
    max_steps: int = 1000
    learning_rate: float = 7e-5
    device: str = "cpu"
    bf16: bool = False
    max_tokens: int = 8
    max_game_tokens: int = 2048
    max_turns: int = 3
    temperature: float = 1.0
    credit: Credit = "move"
    reply_prefix: str = OPEN_TAG
    max_staleness: int = 2
    max_pending_groups: int | None = None
    importance_cap: float = 3.0
    stale_retries: int = 2
    stale_wait: float = 1.0
    publish: bool = True
    anchor_every: int = 50
    codec: str | None = None
    seed: int = 0
    output_dir: str = ".cache/trainer"
    retry_wait: float = 1.0
    retry_max_wait: float = 10.0
    rollout_token: str | None = field(default=None, repr=False)
    examples: ExampleSchedule = ExampleSchedule()
    exam_every: int = 5
    exam_games: int = 16
    exam_turns: int | None = None
    exam_greedy: bool = False
    kl: float = 0.0
    lora_r: int = 0
    lora_alpha: float | None = None
    lora_targets: tuple[str, ...] = DEFAULT_TARGETS
    lora_sync: LoraSync = "merged"
    handover_from_file: str | None = None

    def __post_init__(self) -> None:
        if self.num_generations < 2:
            raise ValueError(
                f"num_generations must be >= 2 (GRPO compares games of one word), got {self.num_generations}"
            )
        if self.games_per_step < 1 or self.games_per_step % self.num_generations:
            raise ValueError(
                f"games_per_step ({self.games_per_step}) must be a positive multiple of num_generations "
                f"({self.num_generations}): each step plays whole groups"
            )
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        if self.max_tokens < 1 or not 1 <= self.max_turns <= 6:
            raise ValueError(f"need max_tokens >= 1 and 1 <= max_turns <= 6, got {self.max_tokens}, {self.max_turns}")
        if not 16 <= self.max_game_tokens <= 65_536:
            raise ValueError(f"max_game_tokens must be in [16, 65536], got {self.max_game_tokens}")
        if self.max_staleness < 0 or self.stale_retries < 0 or self.stale_wait < 0:
            raise ValueError(
                "max_staleness, stale_retries and stale_wait must be >= 0, got "
                f"{self.max_staleness}, {self.stale_retries}, {self.stale_wait}"
            )
        if self.device not in ("cpu", "cuda", "cuda:0"):
            raise ValueError(
                f"device must be cpu or cuda (resolve auto with models.hardware.plan_trainer first; for "
                f"another GPU set CUDA_VISIBLE_DEVICES to it and use cuda), got {self.device!r}"
            )
        if self.bf16 and self.device == "cpu":
            raise ValueError("bf16 autocast is for a GPU with native bf16; on a CPU the trainer computes in fp32")
        if not 0 < self.retry_wait <= self.retry_max_wait:
            raise ValueError(f"need 0 < retry_wait <= retry_max_wait, got {self.retry_wait}, {self.retry_max_wait}")
        if self.max_pending_groups is not None and self.max_pending_groups < 1:
            raise ValueError(f"max_pending_groups must be >= 1, got {self.max_pending_groups}")
        if not self.importance_cap >= 1:
            raise ValueError(f"importance_cap must be >= 1, got {self.importance_cap}")
        if self.credit not in CREDITS:
            raise ValueError(f"credit must be one of {', '.join(CREDITS)}, got {self.credit!r}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (GRPO needs different games per group), got {self.temperature}")
        if self.exam_every < 0 or not 1 <= self.exam_games <= HELD_OUT_SECRETS:
            raise ValueError(
                f"need exam_every >= 0 (0: no exams) and 1 <= exam_games <= {HELD_OUT_SECRETS}, got "
                f"{self.exam_every}, {self.exam_games}"
            )
        if not 0 <= self.kl < 10:
            raise ValueError(f"kl must be >= 0 and below 10, got {self.kl}")
        if self.exam_turns is not None and not 1 <= self.exam_turns <= MAX_EXAM_TURNS:
            raise ValueError(f"exam_turns must be 1 to {MAX_EXAM_TURNS}, got {self.exam_turns}")
        if not 0 <= self.lora_r <= MAX_RANK:
            raise ValueError(f"lora_r must be 0 (no adapter) to {MAX_RANK}, got {self.lora_r}")
        if self.lora_sync not in LORA_SYNCS:
            raise ValueError(f"lora_sync must be one of {', '.join(LORA_SYNCS)}, got {self.lora_sync!r}")
        if self.lora_alpha is not None and not 0 < self.lora_alpha <= 1e6:
            raise ValueError(f"lora_alpha must be positive (at most 1e6), got {self.lora_alpha}")
        if not self.lora_targets:
            raise ValueError("lora_targets must name at least one module (e.g. q_proj)")
        check_target_names(self.lora_targets)
        if self.lora_r and not self.fleet:
            raise ValueError(
                "a LoRA run needs the fleet (the servers learn the adapter from the run's settings in the "
                "bucket): leave --rollout-url unset"
            )
        if self.lora_r and self.lora_sync == "adapter":  # each server loads the adapter, and keeps staleness + 1 of it
            if self.lora_r > MAX_ADAPTER_RANK:
                raise ValueError(
                    f"--lora-r {self.lora_r} with --lora-sync adapter: no rollout engine serves an "
                    f"adapter above rank {MAX_ADAPTER_RANK}; lower --lora-r, or use --lora-sync merged"
                )
            if kept_versions_refusal(self.max_staleness + 1):
                raise ValueError(kept_versions_refusal(self.max_staleness + 1))

    def grpo_config(self, reward_weights: list[float]) -> Any:
        """TRL's `GRPOConfig` for one run of these settings: one optimizer step per `games_per_step` games, the KL
        term `kl`, a log line per step, nothing saved (the bucket is the checkpoint)."""
        from trl import GRPOConfig

        return GRPOConfig(
            output_dir=self.output_dir,
            max_steps=self.max_steps,
            learning_rate=self.learning_rate,
            per_device_train_batch_size=self.games_per_step,
            gradient_accumulation_steps=1,
            num_generations=self.num_generations,
            max_completion_length=self.max_tokens * self.max_turns * 4,
            temperature=self.temperature,
            reward_weights=reward_weights,
            beta=self.kl,
            use_cpu=self.device == "cpu",
            bf16=self.bf16,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            seed=self.seed,
            data_seed=self.seed,
            dataloader_num_workers=0,
        )

    @property
    def exam(self) -> ExamSettings | None:
        """How the rollout servers examine the policy (None: `exam_every` 0, no exams)."""
        if not self.exam_every:
            return None
        return ExamSettings(
            every=self.exam_every,
            games=self.exam_games,
            turns=self.exam_turns or self.max_turns,
            temperature=0.0 if self.exam_greedy else self.temperature,
            seed=self.seed % 2**31,
        )

    @property
    def lora(self) -> bool:
        """The run trains a LoRA adapter (`lora_r` > 0)."""
        return self.lora_r > 0

    @property
    def fleet(self) -> bool:
        """Games come from the fleet through the bucket (no rollout URL given)."""
        return self.rollout_url is None

    def pending_groups(self, ranks: int = 1) -> int:
        """The back-pressure bound the rollout servers are told (see `max_pending_groups`), for a trainer of
        `ranks` ranks (each trains on `groups_per_step` groups a step)."""
        return self.max_pending_groups or self.groups_per_step * ranks * max(1, self.max_staleness - 1)

    @property
    def groups_per_step(self) -> int:
        """Wordle words per optimizer step."""
        return self.games_per_step // self.num_generations
