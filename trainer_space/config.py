"""The trainer's settings, one dataclass beside the trainer (as TRL keeps `GRPOConfig` beside `GRPOTrainer`): each
field documented once, its help the flag's (`settings.add_flags`: ``python app.py trainer --help``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import settings
from settings import flag
from wire.curriculum import ExampleMode, ExampleSchedule
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

BUCKET_HELP = "bucket to publish to and resume from: a folder, s3://..., hf://buckets/NS/NAME"
MODEL_HELP = "model folder or Hub id to start from (on resume, the bucket's weights are loaded into it)"


@dataclass(frozen=True)
class TrainerConfig:
    """Everything a training session needs; checked on construction. A field with a flag is documented by its help;
    the others are set by the trainer (`device`, `bf16`: `models.hardware.plan_trainer`) or by tests and benchmarks."""

    bucket: str = field(metadata=flag(BUCKET_HELP, settings.BUCKET))
    rollout_url: str | None = field(metadata=flag(settings.ROLLOUT_URL.help, settings.ROLLOUT_URL))
    model: str = field(metadata=flag(MODEL_HELP, settings.MODEL))
    env_url: str | None = field(
        default=None, metadata=flag("the Wordle env Space, linked from the UI", settings.ENV_URL)
    )
    games_per_step: int = field(default=8, metadata=flag("games per optimizer step (a multiple of --num-generations)"))
    num_generations: int = field(default=4, metadata=flag("games per secret word: the GRPO group"))
    max_steps: int = field(default=1000, metadata=flag("optimizer steps per run"))
    learning_rate: float = field(
        default=7e-5,
        metadata=flag("AdamW learning rate of the fp32 master weights (docs/training.md: how it was chosen)"),
    )
    #: Torch device of the master weights, the optimizer state and the published state: cpu or cuda (the one GPU the
    #: process sees: transformers' Trainer would move the model to cuda:0).
    device: str = "cpu"
    #: Forward and backward passes under bf16 autocast (a GPU with native bf16); the published weights keep the
    #: checkpoint's dtype either way.
    bf16: bool = False
    max_tokens: int = field(default=8, metadata=flag("tokens per model turn (a tagged guess takes ~4)"))
    #: Most tokens of one game, prompt and completion (fleet): the servers cut a game there; a longer one is refused.
    max_game_tokens: int = 2048
    max_turns: int = field(default=3, metadata=flag("guesses per game in training (Wordle allows 6)"))
    temperature: float = field(
        default=1.0,
        metadata=flag("sampling temperature of the training games (and of the exams, unless --exam-greedy)"),
    )
    credit: Credit = field(
        default="move",
        metadata=flag(
            "what GRPO trains with which reward: one move per group with its own reward (move), or every "
            "move with the game's total (game); see docs/training.md"
        ),
    )
    reply_prefix: str = field(
        default=OPEN_TAG,
        metadata=flag(
            "text that opens each reply, written for the policy and never trained on ('' lets the model write it all)"
        ),
    )
    max_staleness: int = field(default=2, metadata=flag("most versions a game's weights may lag the trainer's"))
    #: Fleet back-pressure: the servers stop producing while this many groups wait (None: what the staleness bound
    #: can use, `pending_groups`).
    max_pending_groups: int | None = None
    #: Upper bound of a token's importance weight (TRL's `vllm_importance_sampling_clip_max`, `offpolicy.py`).
    importance_cap: float = 3.0
    #: Request mode: rounds of replaying stale games in one step before the rest are dropped, and the wait before.
    stale_retries: int = 2
    stale_wait: float = 1.0
    #: Publish a version after every step (off only for benchmarks); an anchor every `anchor_every` versions; the
    #: delta codec (None: the default).
    publish: bool = True
    anchor_every: int = 50
    codec: str | None = None
    seed: int = field(default=0, metadata=flag("seed of the game order and of TRL's sampler"))
    #: Where TRL may write logs (nothing else is saved there: the bucket is the checkpoint).
    output_dir: str = ".cache/trainer"
    #: Request mode: seconds before retrying a failed rollout request, doubled up to `retry_max_wait`, with jitter.
    retry_wait: float = 1.0
    retry_max_wait: float = 10.0
    rollout_token: str | None = field(
        default=None, repr=False, metadata=flag(settings.ROLLOUT_TOKEN.help, settings.ROLLOUT_TOKEN)
    )
    examples: ExampleMode = field(
        default=ExampleMode.FADING,
        metadata=flag(
            "whether training games show the env's example guess: off, fixed (every message) or fading "
            "(every message up to --fade-start, none from --fade-end); see docs/training.md"
        ),
    )
    fade_start: int = field(
        default=ExampleSchedule().start, metadata=flag("fading: the last weight version whose games show every example")
    )
    fade_end: int = field(
        default=ExampleSchedule().end, metadata=flag("fading: the first weight version whose games show none")
    )
    exam_every: int = field(
        default=5,
        metadata=flag(
            "an exam every this many versions (and of version 0): held-out words, no examples, never "
            "trained on; 0: no exams"
        ),
    )
    exam_games: int = field(default=16, metadata=flag("held-out words an exam plays"))
    exam_turns: int | None = field(default=None, metadata=flag("replies per exam game (default: --max-turns)"))
    exam_greedy: bool = field(
        default=False,
        metadata=flag("exams sample greedily (default: at the training temperature, with a fixed seed)"),
    )
    kl: float = field(
        default=0.0,
        metadata=flag(
            "weight of the KL divergence to the model folder's weights in GRPO's loss (TRL's beta; 0: no "
            "reference model loaded)"
        ),
    )
    lora_r: int = field(
        default=0,
        metadata=flag(
            "train a LoRA adapter of this rank instead of every weight (0: no adapter; needs the fleet; "
            "merged runs an empty bucket); see the README's LoRA section"
        ),
    )
    lora_alpha: float | None = field(default=None, metadata=flag("LoRA's alpha (default: 2 * --lora-r)"))
    lora_targets: tuple[str, ...] = field(
        default=DEFAULT_TARGETS,
        metadata=flag("comma-separated names of the modules adapted (default: every attention and MLP projection)"),
    )
    lora_sync: LoraSync = field(
        default="merged",
        metadata=flag(
            "how the adapter reaches the rollout servers: merged (the base with the adapter merged in, as "
            "deltas of the served weights) or adapter (the adapter's tensors alone, applied under PEFT)"
        ),
    )
    handover_from_file: str | None = field(
        default=None,
        metadata=flag(
            "the trainer's previous signing key, when its key replaces it: a file of yours holding its text "
            "(ed25519-private:...) or a key file kept in ~/.cache/delta/keys; rollout servers that trust it follow "
            "the new key (env DELTA_HANDOVER_FROM: the key's text; never the key on the command line)",
            metavar="FILE",
        ),
    )

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
        self.schedule  # noqa: B018 - the fading schedule's checks (start before end)
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
        from ._trl import GRPOConfig

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
    def schedule(self) -> ExampleSchedule:
        """How likely a training game's messages show the env's example guess, by the version that starts it: the
        same rule for every player (written into the run's settings, or sent with each request)."""
        return ExampleSchedule(mode=self.examples, start=self.fade_start, end=self.fade_end)

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
