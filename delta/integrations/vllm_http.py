"""A client for the weight-update routes of a running `vllm serve` (started with `VLLM_SERVER_DEV_MODE=1`), and for
its LoRA routes (`--enable-lora`, `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`).

Standard library only (urllib). Every method blocks until the server answered; a refusal or an
unreachable server raises `VLLMServerError` with the route, the status and the server's message.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

__all__ = ["VLLMHTTPClient", "VLLMServerError"]


class VLLMServerError(ConnectionError):
    """A vLLM server refused a request or could not be reached.

    Attributes:
        route: The route called (e.g. "/update_weights").
        status: The HTTP status, or None when the server could not be reached.
    """

    def __init__(self, message: str, *, route: str, status: int | None) -> None:
        super().__init__(message)
        self.route = route
        self.status = status


class VLLMHTTPClient:
    """Drives one server's pause / weight-update / resume routes.

    Args:
        url: The server's base URL, e.g. `http://127.0.0.1:8000`.
        timeout: Seconds to wait for each answer (an update of a large model takes a while).
    """

    def __init__(self, url: str, timeout: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, route: str, body: dict[str, Any] | None = None,
              needs: str = "VLLM_SERVER_DEV_MODE=1") -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + route, data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:500]
            hint = f" (is the server started with {needs}?)" if e.code == 404 else ""
            raise VLLMServerError(f"{method} {self.url}{route} answered {e.code}: {detail}{hint}",
                                  route=route, status=e.code) from e
        except (urllib.error.URLError, OSError) as e:
            raise VLLMServerError(f"{method} {self.url}{route} failed: {e}; is the vLLM server running there?",
                                  route=route, status=None) from e
        try:
            return json.loads(raw) if raw else None
        except ValueError:  # the LoRA routes answer plain text
            return raw.decode(errors="replace")

    def wait_ready(self, timeout: float) -> None:
        """Wait until `/health` answers 200; raises VLLMServerError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._call("GET", "/health")
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
        return bool(self._call("GET", "/is_paused")["is_paused"])

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
        return self._call("GET", "/weight_info")["weight_version"]

    def base_model(self) -> str:
        """The path or Hub id the server loaded its base model from (the root of `/v1/models`' model that no other
        is built on; the adapters loaded name it as their parent)."""
        models = self._call("GET", "/v1/models")["data"]
        return next(m.get("root") or m["id"] for m in models if not m.get("parent"))

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Serve the PEFT adapter folder `path` as model `name` (`vllm serve --enable-lora`, runtime updates on)."""
        self._call("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}, _LORA_ROUTES)

    def unload_lora_adapter(self, name: str) -> None:
        self._call("POST", "/v1/unload_lora_adapter", {"lora_name": name}, _LORA_ROUTES)


#: What a stock server needs for the LoRA routes (said when they answer 404).
_LORA_ROUTES = "--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"
