"""A client for the weight-update routes of a running `vllm serve` (started with `VLLM_SERVER_DEV_MODE=1`), and for
its LoRA routes (`--enable-lora`, `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`).

Standard library only (urllib). Every method blocks until the server answered, within the client's `timeout` for the
whole call and `MAX_REPLY_BYTES` (`delta.replies.read_reply`); a refusal, an unreachable server or a reply that is not
what the route answers raises `VLLMServerError` with the route, the status and the server's message, in one line."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from ..errors import ReplyLimitError, printable
from ..replies import read_reply

__all__ = ["MAX_REPLY_BYTES", "VLLMHTTPClient", "VLLMServerError"]

#: Most bytes of one reply: the routes answer a few hundred bytes (`/v1/models` about 300 a model served).
MAX_REPLY_BYTES = 1 << 20
#: Bytes asked of the connection at a time (it gives what has arrived, up to this).
_CHUNK = 1 << 16


class VLLMServerError(ConnectionError):
    """A vLLM server refused a request, could not be reached, or answered something else than the route answers.

    Attributes:
        route: The route called (e.g. "/update_weights").
        status: The HTTP status, or None when the server could not be reached (or its reply was cut off).
    """

    def __init__(self, message: str, *, route: str, status: int | None) -> None:
        super().__init__(message)
        self.route = route
        self.status = status


class VLLMHTTPClient:
    """Drives one server's pause / weight-update / resume routes.

    Args:
        url: The server's base URL, e.g. `http://127.0.0.1:8000`.
        timeout: Seconds to wait for each call, answer included (an update of a large model takes a while).
    """

    def __init__(self, url: str, timeout: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _call(
        self,
        method: str,
        route: str,
        body: dict[str, Any] | None = None,
        needs: str = "VLLM_SERVER_DEV_MODE=1",
        timeout: float | None = None,
    ) -> Any:
        """`method route` with a JSON body; the reply parsed as JSON (plain text where it is not), read whole within
        `timeout` (default the client's) and `MAX_REPLY_BYTES`."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + route, data=data, method=method, headers={"Content-Type": "application/json"} if data else {}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = read_reply(_pieces(response), max_bytes=MAX_REPLY_BYTES, deadline=deadline)
        except urllib.error.HTTPError as e:
            try:
                detail = printable(
                    read_reply(_pieces(e), max_bytes=MAX_REPLY_BYTES, deadline=deadline).decode(errors="replace")[:500]
                )
            except (ReplyLimitError, OSError) as cut:
                detail = f"({cut})"
            hint = f" (is the server started with {needs}?)" if e.code == 404 else ""
            raise VLLMServerError(
                f"{method} {self.url}{route} answered {e.code}: {detail}{hint}", route=route, status=e.code
            ) from e
        except ReplyLimitError as e:
            raise VLLMServerError(
                f"{method} {self.url}{route} answered with {e}: refused; is {self.url} a vLLM server?",
                route=route,
                status=None,
            ) from e
        except (urllib.error.URLError, OSError) as e:
            raise VLLMServerError(
                f"{method} {self.url}{route} failed: {e}; is the vLLM server running there?", route=route, status=None
            ) from e
        try:
            return json.loads(raw) if raw else None
        except ValueError:  # the LoRA routes answer plain text
            return raw.decode(errors="replace")

    def _field(self, route: str, key: str, kinds: tuple[type, ...]) -> Any:
        """`GET route`'s JSON object's `key`, which must be one of `kinds`."""
        reply = self._call("GET", route)
        if not isinstance(reply, dict) or key not in reply or not isinstance(reply[key], kinds):
            raise self._unexpected(route, reply, f"an object with {key!r}")
        return reply[key]

    def _unexpected(self, route: str, reply: Any, expected: str) -> VLLMServerError:
        """The error for a reply of `route` that is not `expected`: one line, the reply shown escaped and cut."""
        shown = printable(json.dumps(reply) if not isinstance(reply, str) else repr(reply))
        return VLLMServerError(
            f"GET {self.url}{route} answered {shown[:200]}, not {expected}: is {self.url} a vLLM server?",
            route=route,
            status=200,
        )

    def wait_ready(self, timeout: float) -> None:
        """Wait until `/health` answers 200; raises VLLMServerError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._call("GET", "/health", timeout=min(self.timeout, max(1.0, deadline - time.monotonic())))
                return
            except VLLMServerError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def init(self, init_info: dict[str, Any]) -> None:
        self._call("POST", "/init_weight_transfer_engine", {"init_info": init_info})

    def pause(self) -> None:
        """Pause generation, keeping requests in flight frozen (they continue on `resume`)."""
        self._call("POST", "/pause?mode=keep")

    def is_paused(self) -> bool:
        return self._field("/is_paused", "is_paused", (bool,))

    def start_update(self) -> None:
        self._call("POST", "/start_weight_update")

    def update(self, update_info: dict[str, Any]) -> None:
        self._call("POST", "/update_weights", {"update_info": update_info})

    def finish_update(self, version: str | None = None) -> None:
        self._call("POST", "/finish_weight_update", {"weight_version": version})

    def reset_prefix_cache(self) -> None:
        self._call("POST", "/reset_prefix_cache")

    def resume(self) -> None:
        self._call("POST", "/resume")

    def weight_version(self) -> str | None:
        return self._field("/weight_info", "weight_version", (str, type(None)))

    def base_model(self) -> str:
        """The path or Hub id the server loaded its base model from (the root of `/v1/models`' model that no other
        is built on; the adapters loaded name it as their parent).

        Raises:
            VLLMServerError: the reply is not a list of models with one of them a base (one line, at any call).
        """
        models = self._field("/v1/models", "data", (list,))
        base = next((m.get("root") or m.get("id") for m in models if isinstance(m, dict) and not m.get("parent")), None)
        if not isinstance(base, str) or not all(isinstance(m, dict) for m in models):
            raise self._unexpected("/v1/models", {"data": models}, "a list of models, one of them a base model")
        return base

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Serve the PEFT adapter folder `path` as model `name` (`vllm serve --enable-lora`, runtime updates on)."""
        self._call("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}, _LORA_ROUTES)

    def unload_lora_adapter(self, name: str) -> None:
        self._call("POST", "/v1/unload_lora_adapter", {"lora_name": name}, _LORA_ROUTES)


#: What a stock server needs for the LoRA routes (said when they answer 404).
_LORA_ROUTES = "--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"


def _pieces(response: Any) -> Iterator[bytes]:
    """A urllib reply's body, each piece as soon as it arrives (`read1`), for `read_reply`."""
    return iter(lambda: response.read1(_CHUNK), b"")
