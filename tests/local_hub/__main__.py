"""Run the local Hub: `python -m tests.local_hub --root DIR --port N [--config FILE]`.

The config file (JSON) seeds users, tokens, buckets and settings:

    {"users": [{"name": "alice", "orgs": ["team"]}],
     "tokens": [{"user": "alice", "scope": "write", "token": "hf_alice_write"}],
     "buckets": [{"id": "alice/b1", "private": true}],
     "settings": {"page_size": 50}}

Users and tokens missing from the root are added at every start (a revoked token stays revoked); buckets and
settings only when the root is new, so a restart keeps what the admin API changed. Every request is logged on
stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import uvicorn

from .app import LocalHubApp
from .store import Store


def seed(store: Store, config: dict[str, Any], fresh: bool) -> None:
    """Apply a config file to `store` (see the module docstring for what applies when)."""
    for user in config.get("users", []):
        if user["name"] not in store.users:
            store.add_user(user["name"], user.get("orgs", []))
    for token in config.get("tokens", []):
        if token.get("token") not in store.tokens:
            store.add_token(token["user"], token.get("scope", "write"), token.get("token"))
    if fresh:
        for bucket in config.get("buckets", []):
            store.create_bucket(bucket["id"], bool(bucket.get("private", False)))
        for key, value in config.get("settings", {}).items():
            setattr(store.settings, key, value)
        store.save()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.local_hub", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="folder for the state and the xorbs (kept)")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--host", default="127.0.0.1", help="keep the loopback address: the admin API has no auth")
    parser.add_argument("--config", type=Path, help="JSON file of users, tokens, buckets and settings")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    fresh = not (args.root / "state.json").exists()
    store = Store(args.root)
    if args.config:
        seed(store, json.loads(args.config.read_text()), fresh)
    logging.getLogger("local_hub").info("serving http://%s:%d from %s", args.host, args.port, args.root)
    uvicorn.run(LocalHubApp(store), host=args.host, port=args.port, http="h11", log_level="warning",
                access_log=False, timeout_graceful_shutdown=2)


if __name__ == "__main__":
    main()
