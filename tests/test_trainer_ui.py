"""The trainer UI's pieces, built from a session without Gradio running (no servers)."""

from __future__ import annotations

import gradio as gr

from trainer_space import TrainerConfig, TrainingSession
from trainer_space.ui import build_ui, figures, status_markdown


def test_ui_builds_and_shows_an_idle_session(tmp_path) -> None:
    session = TrainingSession(TrainerConfig(str(tmp_path / "b"), "http://127.0.0.1:1", str(tmp_path)))
    assert isinstance(build_ui(session), gr.Blocks)
    text = status_markdown(session.status())
    assert "**stopped** · version **0** · step **0**" in text and "0 dropped" in text
    rewards, payload, heatmap = figures(session)  # no data yet: figures that say so, no error
    assert all(f.layout.title.text for f in (rewards, payload, heatmap))


def test_recent_games_come_from_the_rollouts_newest_first(tmp_path) -> None:
    session = TrainingSession(TrainerConfig(str(tmp_path / "b"), "http://127.0.0.1:1", str(tmp_path)))
    assert session.recent_games() == []  # before the first run
