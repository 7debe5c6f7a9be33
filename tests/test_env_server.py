"""The Space process: ``env_space.server`` started through ``app.py`` as a Space starts it."""

from __future__ import annotations

import httpx

from ._env_server import running_server


def test_api_and_ui_share_one_port() -> None:
    with running_server(env={"SPACE_ROLE": "env"}) as url:  # as a Space starts it
        assert httpx.get(f"{url}/health").json() == {"status": "healthy"}
        page = httpx.get(f"{url}/")
        assert page.status_code == 200 and "Wordle environment" in page.text
        # The API's /reset is not shadowed by the UI mounted at "/".
        reset = httpx.post(f"{url}/reset", json={"secret": "crane"}).json()
        assert set(reset) == {"observation", "reward", "done"}
        # Gradio endpoints a machine may call are named; the timer's are private.
        info = httpx.get(f"{url}/gradio_api/info").json()
        assert set(info["named_endpoints"]) == {"/guess", "/new_game"}
