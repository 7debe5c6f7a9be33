"""One entry point for every Space: ``python app.py ROLE [options]``, or ``SPACE_ROLE=ROLE python app.py``.

Roles available now: ``env`` (the Wordle environment: UI and HTTP API on one port).
"""

from __future__ import annotations

import argparse
import os
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    roles = parser.add_subparsers(dest="role", required=True, title="roles")
    env = roles.add_parser("env", help="the Wordle environment: UI and HTTP API")
    # Spaces set GRADIO_SERVER_NAME/PORT; locally the default stays on loopback.
    env.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    env.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    env.add_argument("--max-sessions", type=int, default=1024, help="live games at most (default 1024)")
    env.add_argument("--session-ttl", type=float, default=600.0, help="idle seconds before a game is dropped")
    return parser


def main(argv: list[str]) -> None:
    parser = _parser()
    role = os.environ.get("SPACE_ROLE")
    if role and (not argv or argv[0].startswith("-")):
        argv = [role, *argv]
    if not argv:
        parser.error("no role given: name one, or set SPACE_ROLE; available roles: env")
    args = parser.parse_args(argv)

    from env_space.sessions import SessionLimits

    try:
        limits = SessionLimits(args.max_sessions, args.session_ttl)
    except ValueError as e:
        parser.error(str(e))
    from env_space.server import serve

    serve(args.host, args.port, limits)


if __name__ == "__main__":
    main(sys.argv[1:])
