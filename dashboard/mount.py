"""Mounting a Space's Gradio UI on its API app, the same way for the three Spaces."""

from __future__ import annotations

import gradio as gr
from fastapi import FastAPI

#: Gradio 6's screen-reader status region announces these keys untranslated ("common.complete"), and a
#: visitor's screen reader or text copy got the raw key; the words it should have said.
STATUS_WORDS = {
    "common.complete": "Complete",
    "common.error": "Error",
    "common.loading": "Loading",
    "common.progress": "Progress",
    "common.clear": "Clear",
}


def mount_ui(app: FastAPI, blocks: gr.Blocks, css: str) -> FastAPI:
    """Mount ``blocks`` at ``/`` on ``app`` (its routes, such as ``/health``, stay the API's)."""
    return gr.mount_gradio_app(
        app, blocks, path="/", css=css, ssr_mode=False, footer_links=["api"], i18n=gr.I18n(en=STATUS_WORDS)
    )
