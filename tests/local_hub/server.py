"""`LocalHub`: the local Hub as a real server process for tests, on a free port of 127.0.0.1, plus a small client of
its admin API. Modelled on `tests.rclone_server.RcloneS3Server`; imports only the standard library (huggingface_hub
when `api()` is called), so fixtures can import it at collection time.

    with LocalHub(tmp_path / "hub") as hub:
        api = hub.api("alice")                     # HfApi(endpoint=hub.endpoint, token=alice's write token)
        api.create_bucket("alice/b1")
        hub.add_fault(kind="status", route="api.batch", status=503, times=2)
        hub.counts()["classes"]                    # {"api": ..., "resolver": ..., "cas": ..., "unknown": 0}
        hub.restart()                              # same port, same root, same data

Users made at the first start: `alice` (member of org `team`), `bob`; tokens: `hub.token("alice")` (write),
`hub.token("alice", "read")`, `hub.token("bob")`. The server's log (one line per request, and the operations of each
batch call) goes to `log_path`.
"""

from __future__ import annotations

import json
import secrets
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests._ports import free_port
from tests._served_process import ServedProcess

if TYPE_CHECKING:
    from huggingface_hub import HfApi

REPO_ROOT = Path(__file__).resolve().parents[2]


class LocalHub(ServedProcess):
    """The local Hub serving `root` on 127.0.0.1:`port` (see the module docstring).

    Args:
        root: Folder for the server's state and xorbs (created; kept across restarts).
        port: Default a free port; kept across restarts.
        log_path: Default `<root>.local_hub.log`, appended across restarts.
        settings: Settings for a new root (see `tests.local_hub.store.Settings`).
    """

    name = "the local hub"

    def __init__(
        self,
        root: Path,
        *,
        port: int | None = None,
        log_path: Path | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        super().__init__(port or free_port(), log_path or self.root.with_name(f"{self.root.name}.local_hub.log"))
        self.config_path = self.root.with_name(f"{self.root.name}.local_hub.json")
        if self.config_path.exists():
            self._config = json.loads(self.config_path.read_text())
        else:
            self._config = _first_config(settings)
            self.config_path.write_text(json.dumps(self._config))

    def reset(self, settings: dict[str, Any] | None = None) -> None:
        """A fresh Hub in the running server, as if started on a new root: every bucket, Space, user and token gone,
        `alice` and `bob` back with new tokens (so that nothing a client process keeps per token, such as its rate
        limit, its listing or its Xet token, carries over), `settings` over the defaults, no fault, counts and quota
        at zero. What a test sharing the session's server starts from (tests/conftest.py)."""
        self._config = _first_config(settings)
        self.config_path.write_text(json.dumps(self._config))
        self._admin("POST", "/reset", self._config)

    def token(self, user: str = "alice", scope: str = "write") -> str:
        """A token made at the first start for `user` with `scope`."""
        for token in self._config["tokens"]:
            if token["user"] == user and token["scope"] == scope:
                return token["token"]
        raise KeyError(f"no {scope} token for {user!r} in the local hub's config; make one with add_token()")

    def api(self, user: str | None = "alice", scope: str = "write") -> HfApi:
        """An `HfApi` pointed at this server with `user`'s token (`user=None`: anonymous)."""
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.endpoint, token=self.token(user, scope) if user else False)

    def env(self, user: str = "alice", scope: str = "write") -> dict[str, str]:
        """Environment for a subprocess that should reach this server through huggingface_hub."""
        return {
            "HF_ENDPOINT": self.endpoint,
            "HF_TOKEN": self.token(user, scope),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_HUB_OFFLINE": "0",  # whatever the parent process was told: this one is meant to reach the (local) Hub
        }

    def start(self, timeout: float = 90.0) -> None:
        """Start the server and return once its admin API answers.

        Raises:
            RuntimeError: It exited or did not answer within `timeout` seconds; the message holds its log.
        """
        command = [
            sys.executable,
            "-m",
            "tests.local_hub",
            "--root",
            str(self.root),
            "--port",
            str(self.port),
            "--config",
            str(self.config_path),
        ]
        self._launch(command, self._answers, timeout, cwd=REPO_ROOT)

    def _answers(self) -> bool:
        try:
            self._admin("GET", "/health", timeout=0.5)
        except OSError:
            return False
        return True

    # --- the admin API -----------------------------------------------------------------------------

    def _admin(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.endpoint}/_local_hub{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"local hub admin {method} {path}: HTTP {error.code} {error.read()!r}") from error
        if response.headers.get("content-type", "").startswith("application/json"):
            return json.loads(raw)
        return raw

    def add_user(self, name: str, orgs: list[str] | None = None) -> None:
        self._admin("POST", "/users", {"name": name, "orgs": orgs or []})

    def add_token(self, user: str, scope: str = "write") -> str:
        """A new token for `user` (created if missing)."""
        return self._admin("POST", "/tokens", {"user": user, "scope": scope})["token"]

    def revoke_token(self, token: str) -> None:
        self._admin("DELETE", f"/tokens/{urllib.parse.quote(token, safe='')}")

    def set_bucket(self, bucket_id: str, *, private: bool, create: bool = False) -> None:
        """Set a bucket's visibility (creating it with `create=True`), bypassing auth."""
        self._admin("PUT", f"/buckets/{bucket_id}", {"private": private, "create": create})

    def settings(self, **changes: Any) -> dict[str, Any]:
        """Change settings (`page_size`, `xet_token_lifetime_s`, `xorb_grants`, `cas_v2`, `quota`, `events_off`,
        `events_replay_s`, `events_ping_s`: see `tests.local_hub.store.Settings`); returns them all."""
        return self._admin("PUT", "/settings", changes)

    def add_fault(self, **rule: Any) -> int:
        """Add a fault rule (see `tests.local_hub.faults`); returns its id."""
        return self._admin("POST", "/faults", rule)["id"]

    def faults(self) -> list[dict[str, Any]]:
        return self._admin("GET", "/faults")

    def clear_faults(self) -> None:
        self._admin("DELETE", "/faults")

    def counts(self) -> dict[str, Any]:
        return self._admin("GET", "/counts")

    def reset_counts(self) -> None:
        self._admin("DELETE", "/counts")

    def requests(self) -> list[dict[str, Any]]:
        """The last requests the server saw (method, path, query, route, cls, user, status, range)."""
        return self._admin("GET", "/requests")

    def reset_quota(self) -> None:
        self._admin("DELETE", "/quota")

    def state(self) -> dict[str, Any]:
        return self._admin("GET", "/state")

    def file_bytes(self, bucket_id: str, path: str) -> bytes:
        """A file's content as the server decodes it from its own xorbs (not through the clients)."""
        return self._admin("GET", f"/files/{bucket_id}/{urllib.parse.quote(path)}")

    def space(self, space_id: str) -> dict[str, Any]:
        """A Space repository as the server holds it: sdk, private, head, variables, secrets (with their values,
        which the Hub routes never send back), hardware_requests, files (path → oid, size), commits."""
        return self._admin("GET", f"/spaces/{space_id}")

    def space_file(self, space_id: str, path: str) -> bytes:
        """A file of a Space repository as committed."""
        return self._admin("GET", f"/spaces/{space_id}/files/{urllib.parse.quote(path)}")


def _first_config(settings: dict[str, Any] | None) -> dict[str, Any]:
    """Users `alice` (of org `team`) and `bob`, with tokens made now, and `settings`."""
    return {
        "users": [{"name": "alice", "orgs": ["team"]}, {"name": "bob", "orgs": []}],
        "tokens": [
            {"user": "alice", "scope": "write", "token": "hf_alice_w_" + secrets.token_hex(8)},
            {"user": "alice", "scope": "read", "token": "hf_alice_r_" + secrets.token_hex(8)},
            {"user": "bob", "scope": "write", "token": "hf_bob_w_" + secrets.token_hex(8)},
        ],
        "settings": settings or {},
    }
