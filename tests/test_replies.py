"""Every HTTP client of the project takes a reply through `delta.replies.read_reply`: a server that answers without end, or a
byte at a time, costs the client a bounded memory and a bounded time, and the caller one line. Against raw loopback
servers that do just that (no web framework between)."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from delta.errors import ReplyLimitError
from delta.replies import read_reply

HEADERS = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"


class _Reply(socketserver.BaseRequestHandler):
    """Answers any request with `HEADERS` and then a body that never ends: 64 KiB pieces at once (`endless`), or one
    byte each 50 ms (`drip`), until the client hangs up."""

    def handle(self) -> None:
        self.request.recv(65536)
        piece, wait = (b"[" + b"0," * 32767, 0.0) if self.server.kind == "endless" else (b" ", 0.05)
        with contextlib.suppress(OSError):
            self.request.sendall(HEADERS)
            while True:
                self.request.sendall(piece)
                time.sleep(wait)


@contextlib.contextmanager
def answering(kind: str) -> Iterator[str]:
    """A loopback server whose every reply is `kind` (see `_Reply`); yields its URL."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Reply)
    server.daemon_threads, server.kind = True, kind
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_read_reply_takes_a_whole_reply_within_its_bounds() -> None:
    assert read_reply(iter([b"ab", b"c"]), max_bytes=3, deadline=time.monotonic() + 5) == b"abc"
    with pytest.raises(ReplyLimitError, match=r"^a reply over 3 bytes$") as refused:
        read_reply(iter([b"ab", b"cd"]), max_bytes=3, deadline=time.monotonic() + 5)
    assert refused.value.limit == "size"



def test_read_reply_refuses_the_first_piece_after_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr("delta.replies.time.monotonic", lambda: clock[0])

    def drip() -> Iterator[bytes]:  # a byte every 0.1 s, without end
        while True:
            clock[0] += 0.1
            yield b"x"

    with pytest.raises(ReplyLimitError, match=r"^a reply still coming at its deadline \(3 bytes so far\)$") as late:
        read_reply(drip(), max_bytes=1 << 20, deadline=100.25)
    assert late.value.limit == "time" and clock[0] == pytest.approx(100.3)  # the third piece was the last read


@pytest.mark.parametrize("kind, line", [
    ("endless", r"GET {url}/weight_info answered with a reply over 1,048,576 bytes: refused; is {url} a vLLM server\?"),
    ("drip", r"GET {url}/weight_info answered with a reply still coming at its deadline \(\d+ bytes so far\): refused; "
             r"is {url} a vLLM server\?"),
])
def test_the_vllm_client_refuses_a_reply_without_end(kind: str, line: str) -> None:
    from delta.integrations.vllm_http import VLLMHTTPClient, VLLMServerError

    with answering(kind) as url:
        with pytest.raises(VLLMServerError) as refused:
            VLLMHTTPClient(url, timeout=1.0).weight_version()
    import re

    assert re.fullmatch(line.format(url=re.escape(url)), str(refused.value)), str(refused.value)


@pytest.mark.parametrize("kind", ["endless", "drip"])
def test_the_apps_clients_refuse_a_reply_without_end(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rollout's client of the env, the trainer's of the rollout (its cap lowered here: 256 MiB would take a
    while to send), each in one line, each well within a few times its timeout; a health check says no."""
    from rollout_space.env_client import EnvClient
    from rollout_space.errors import EnvUnavailableError
    from trainer_space import rollout_client
    from wire.errors import RolloutError

    monkeypatch.setattr(rollout_client, "MAX_REPLY_BYTES", 1 << 20)
    reply = "a reply over 1,048,576 bytes" if kind == "endless" else "a reply still coming at its deadline"
    with answering(kind) as url:
        env, rollout = EnvClient(url, timeout=1.0), rollout_client.RolloutClient(url, timeout=1.0)
        for call, error, what in [(lambda: env.exam_info(2, 2), EnvUnavailableError, "the env Space"),
                                  (rollout.status, RolloutError, "the rollout server")]:
            with pytest.raises(error) as refused:
                call()
            message = str(refused.value)
            assert message.startswith(f"{what} at {url} answered /") and reply in message and "\n" not in message
        assert not env.health()
        assert env.close_game("e1") is None  # best effort: a bounded try, no error
        env.close(), rollout.close()


def test_a_server_that_never_answers_is_given_up_on_at_the_client_s_timeout() -> None:
    from delta.integrations.vllm_http import VLLMHTTPClient, VLLMServerError

    with socket.socket() as listening:  # accepts (the kernel's backlog), reads nothing, answers nothing
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        with pytest.raises(VLLMServerError, match=r"timed out; is the vLLM server running there\?$"):
            VLLMHTTPClient(f"http://127.0.0.1:{listening.getsockname()[1]}", timeout=0.5).is_paused()
