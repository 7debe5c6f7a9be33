"""Free loopback ports for the tests' servers; imports nothing of the web stack, so `delta`'s own tests that start a
server (rclone's S3, a publisher's child) collect with `delta`'s dependencies alone."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
