"""The trainer UI's pieces, built from a session without Gradio running (no servers)."""

from __future__ import annotations

import re

import gradio as gr
import pytest

from trainer_space import TrainerConfig, build_session
from trainer_space.ui import X_AXES, build_ui, cut_games_note, figures, learning_figure, status_markdown
from wire.trainer import StepRecord


def test_ui_builds_and_shows_an_idle_session(tmp_path) -> None:
    session = build_session(TrainerConfig(str(tmp_path / "b"), "http://127.0.0.1:1", str(tmp_path)))
    assert isinstance(build_ui(session), gr.Blocks)
    text = status_markdown(session.status())
    assert "**stopped** · version **0** · step **0**" in text and "0 dropped" in text
    assert "valid guesses — · letters found — of 5 · last step took —" in text  # no step yet: no made-up 0.0 s
    assert str(tmp_path) not in text and "bucket: `local folder …/b`" in text  # no local path on a public page
    assert "cut after **3 moves**" in cut_games_note(session.config.max_turns)
    learning, payload, heatmap, offpolicy = figures(session)  # no data yet: figures that say so, no error
    assert all(f.layout.title.text for f in (learning, payload, heatmap, offpolicy))


def test_a_fleet_session_shows_its_run_the_wait_and_its_servers(tmp_path) -> None:
    from wire.trainer import FleetServer, StepRecord
    from trainer_space.ui import fleet_html, offpolicy_figure

    session = build_session(TrainerConfig(str(tmp_path / "b"), None, str(tmp_path)))
    try:
        status = session.status().model_copy(update={"waiting_for_rollouts": True, "groups_ready": 1})
        text = status_markdown(status)
        assert f"games from the rollout fleet through the bucket (run `{session.fleet_run.run_id}`)" in text
        assert "**waiting for rollouts**: 1 of 2 groups ready" in text and "no groups refused" in text
        assert "no heartbeat files refused; no exam files refused · files unsigned (no rollout token)" in text
        from wire.trainer import Staleness

        refused = status.model_copy(update={
            "staleness": Staleness(refused=3), "signed": True,
            "groups_refused": {"torn or corrupt": 2, "token id out of the vocabulary": 1},
            "heartbeats_refused": {"renamed or copied": 1},
            "exams_refused": {"version ahead of the trainer": 1, "too large": 2}})
        assert ("3 groups refused (2 torn or corrupt, 1 token id out of the vocabulary); 1 heartbeat file refused "
                "(1 renamed or copied); 3 exam files refused (2 too large, 1 version ahead of the trainer) · files "
                "signed (rollout token)") in status_markdown(refused)
        assert "No rollout server" in fleet_html([])
        row = fleet_html([FleetServer(id="a", version=3, games_per_min=12.0, last_seen_s=41, state="gone",
                                      idle_share=0.25, groups_written=7, run_id="r", last_error="<boom>")])
        assert "<td>a</td><td>3</td><td>12.0</td><td>41 s ago</td><td>gone</td><td>25%</td>" in row
        assert "&lt;boom&gt;" in row
        starting = fleet_html([FleetServer(id="b", version=0, games_per_min=0.0, last_seen_s=1, state="starting",
                                           idle_share=1.0, groups_written=0, run_id=None, last_error=None)])
        assert "<td>b</td><td>—</td><td>0.0</td><td>1 s ago</td><td>starting</td>" in starting  # not "v0"
        assert "last error" in row and "last error" not in starting  # its wide column only while there is one
        assert row.startswith("<div class='fleet-box' style='overflow-x:auto")  # a phone scrolls the table sideways, not cut off
        assert "<th>weights</th>" in row and "<td>7</td><td>—</td>" in row  # an older server's heartbeat: not said
        assert "⚠" not in row and "UNAUTHENTICATED" not in row
        mine, theirs = "SHA256:" + "A" * 43, "SHA256:" + "B" * 43
        beat = {"version": 3, "games_per_min": 1.0, "last_seen_s": 1, "state": "producing", "idle_share": 0.0,
                "groups_written": 1, "run_id": "r", "last_error": None}
        fleet = fleet_html([
            FleetServer(id="checked", authenticated=True, trusted_key=mine, trusts_trainer=True, **beat),
            FleetServer(id="loose", authenticated=False, **beat),
            FleetServer(id="other", authenticated=True, trusted_key=theirs, trusts_trainer=False, **beat),
            FleetServer(id="new", authenticated=True, **beat)])
        assert "<td>checked</td>" in fleet and "<td>1</td><td>checked</td>" in fleet
        assert "<td>1</td><td><b>⚠ UNAUTHENTICATED</b></td>" in fleet
        assert "<td>1</td><td><b>⚠ another key SHA256:BBBBBBBBBBBB…</b></td>" in fleet
        assert "<td>1</td><td>no key yet</td>" in fleet
        assert ("<p>⚠ Following the bucket UNAUTHENTICATED (--unauthenticated): loose. The weights and run settings "
                "they play with are whatever the bucket holds, whoever wrote them, and their games train this "
                "model.</p>") in fleet
        assert "<p>⚠ Trusting another key than this trainer&#x27;s: other. They refuse its weights" in fleet
        record = StepRecord(step=1, version=1, reward=0.0, win_rate=0.0, valid_rate=0.0, step_s=1.0, cpu_s=1.0,
                            publish_s=0.0, staleness={0: 2, 2: 2}, ratio_mean=1.1, ratio_min=0.5, ratio_max=3.0, at=0.0)
        figure = offpolicy_figure([record])
        assert [t.y[0] for t in figure.data] == [1.1, 0.5, 3.0, 1.0]
        assert [t.yaxis for t in figure.data] == [None, None, None, "y2"]  # staleness (versions) on its own axis
        assert figure.layout.yaxis2.title.text == "staleness (versions)"
    finally:
        session.close()


def test_a_failing_rollout_shows_while_retrying_and_after_recovery(tmp_path) -> None:
    status = build_session(TrainerConfig(str(tmp_path / "b"), "http://127.0.0.1:1", str(tmp_path))).status()
    status = status.model_copy(update={
        "state": "running", "rollout_error": "09:00:00 the rollout server refused /rollout (HTTP 502): <env>",
        "rollout_failing": 3})
    text = status_markdown(status)
    assert "**running**" in text and "**last rollout error** (retrying (3 failed in a row)):" in text
    assert "(HTTP 502): &lt;env&gt;" in text
    assert "**last rollout error** (recovered)" in status_markdown(status.model_copy(update={"rollout_failing": 0}))


def test_a_refusal_that_stopped_the_run_shows_once_and_whole(tmp_path) -> None:
    status = build_session(TrainerConfig(str(tmp_path / "b"), "http://127.0.0.1:1", str(tmp_path))).status()
    refusal = "the rollout server at http://r refused /rollout (HTTP 401): send Bearer <ROLLOUT_TOKEN>"
    text = status_markdown(status.model_copy(update={
        "state": "stopped", "error": f"RolloutRefusedError: {refusal}", "rollout_error": f"09:00:00 {refusal}",
        "rollout_failing": 1}))
    assert "**error:** RolloutRefusedError:" in text and "Bearer &lt;ROLLOUT_TOKEN&gt;" in text  # not an HTML tag
    assert "retrying" not in text and "last rollout error" not in text  # said once, not as a retry
    other = status.model_copy(update={"state": "stopped", "rollout_error": "09:00:00 HTTP 502", "rollout_failing": 2})
    assert "**last rollout error** (the run stopped): 09:00:00 HTTP 502" in status_markdown(other)


def test_learning_curves_show_reward_win_and_valid_rates_by_step_and_by_time() -> None:
    records = [StepRecord(step=n, version=n, reward=-1.0 + 0.1 * n, win_rate=0.0, valid_rate=0.2 * n,
                          letters=0.5 * n, examples_shown=1.0 - 0.25 * n, examples_scheduled=0.9 - 0.2 * n,
                          step_s=30.0, cpu_s=1.0, publish_s=0.1,
                          at=1000.0 + 30.0 * n)
               for n in (1, 2, 3)]
    by_step = learning_figure(records)
    assert [a.text for a in by_step.layout.annotations] == ["mean reward", "win rate", "valid-guess rate (strict)",
                                                            "letters found (of 5)", "examples shown (share of messages)"]
    assert "the exam below plays without" in " ".join(re.sub(r"<br>|</?sup>", " ", by_step.layout.title.text).split())
    assert list(by_step.data[0].x) == [1, 2, 3] and list(by_step.data[4].y) == [0.2, 0.4, 0.6000000000000001]
    assert list(by_step.data[6].y) == [0.5, 1.0, 1.5] and list(by_step.data[8].y) == [0.75, 0.5, 0.25]
    assert by_step.data[10].name == "the schedule, for those games" and list(by_step.data[10].y) == pytest.approx(
        [0.7, 0.5, 0.3])  # what the shown share scatters around, in its panel
    by_time = learning_figure(records, X_AXES[1])
    assert list(by_time.data[0].x) == [0.5, 1.0, 1.5]  # minutes since the first step began
    assert by_time.layout.xaxis5.title.text == "wall time (minutes)"


def test_the_off_policy_figure_says_how_many_replies_straddled_two_versions() -> None:
    from trainer_space.ui import offpolicy_figure, straddle_text

    def records(*steps: tuple[int, bool | None]) -> list[StepRecord]:
        return [StepRecord(step=n, version=n, reward=0.0, win_rate=0.0, valid_rate=0.0, step_s=1.0, cpu_s=1.0,
                           publish_s=0.0, at=float(n), straddled=straddled, versions_reported=reported)
                for n, (straddled, reported) in enumerate(steps, start=1)]

    assert straddle_text(records((0, None))) == "token versions: none recorded yet"
    assert straddle_text(records((0, False), (0, False))) == (
        "replies that straddled two weight versions: 0 (versions per reply: the servers report none per token (they "
        "apply new weights between replies))")
    reported = records((2, True), (1, True))
    assert straddle_text(reported) == ("replies that straddled two weight versions: 3 (each token's version as the "
                                       "servers' vLLM reported it)")
    assert straddle_text(records((1, True), (0, False))).endswith("(each token's version where the server reported "
                                                                  "it, else per reply)")
    title = offpolicy_figure(reported).layout.title.text  # wrapped in subtitle lines a phone's chart shows whole
    unwrapped = " ".join(line.removeprefix("<sup>").removesuffix("</sup>") for line in title.split("<br>"))
    assert unwrapped.endswith(straddle_text(reported))


def test_recent_games_come_from_the_rollouts_newest_first(tmp_path) -> None:
    session = build_session(TrainerConfig(str(tmp_path / "b"), "http://127.0.0.1:1", str(tmp_path)))
    assert session.recent_games() == []  # before the first run


def test_figures_draw_a_real_delta(tmp_path) -> None:
    from models import build_tiny_qwen3
    from tests._engines import step
    from tests._trainer_stack import wait_until

    model = build_tiny_qwen3(str(tmp_path / "model"))
    session = build_session(TrainerConfig(str(tmp_path / "bucket"), "http://127.0.0.1:1", model))
    parts = session.load()  # an empty bucket: the session's payload log measures from version 1 on
    try:
        parts.publisher.publish(parts.published)
        assert parts.publisher.flush(30)
        parts.publisher.publish(step(parts.published, ["model.layers.1.mlp.up_proj.weight", "model.norm.weight"],
                                     seed=1, lr=1e-2))
        assert parts.publisher.flush(30)
        wait_until(lambda: session.payloads.records, 15, "the payload log to measure version 2")
        _, payload, heatmap, _ = figures(session)
    finally:
        session.close()
    assert list(payload.data[0].x) == [2]  # versions with a delta
    anchor = next(t for t in payload.data if t.name == "anchor (full copy)")
    assert list(anchor.x) == [1] and anchor.y[0] > 10 * payload.data[0].y[0]  # version 1: the full copy, shown
    assert heatmap.layout.title.text.startswith("Delta v1→v2 published<br>")
    assert any(v for row in heatmap.data[0].customdata for v in row if v)  # the changed cells are drawn


def test_the_status_says_which_examples_training_shows_and_the_last_exam(tmp_path) -> None:
    from tests.test_dashboard_exam import exam

    session = build_session(TrainerConfig(str(tmp_path / "b"), "http://127.0.0.1:1", str(tmp_path),
                                            fade_start=0, fade_end=10))
    try:
        status = session.status().model_copy(update={"version": 5, "exams": [exam(0, 0.0), exam(5, 0.25)]})
        text = status_markdown(status)
        assert ("example schedule now: 50% of messages in games started by v5 (fading: every message up to v0, none "
                "from v10)") in text and "examples shown, last 5 steps: —" in text
        assert "last exam v5: own words on 25% of moves" in text
        assert "no exams (--exam-every 0)" in status_markdown(status.model_copy(update={"exam": None}))
        assert "none from v10) · no exam yet" in status_markdown(status.model_copy(update={"exams": []}))
        assert "signed with another token" not in text
        other = status_markdown(status.model_copy(update={"exams": [],
                                                          "exams_refused": {"signed with another token": 2}}))
        assert "no exam yet · 2 exam records signed with another token (not shown)" in other  # never in silence
    finally:
        session.close()


def test_a_lora_run_shows_its_adapter_and_trainable_parameters(tmp_path) -> None:
    from wire.lora import LoraSettings

    session = build_session(TrainerConfig(str(tmp_path / "b"), None, str(tmp_path)))
    try:
        status = session.status()
        assert status.lora is None and "LoRA" not in status_markdown(status)
        lora = LoraSettings(sync="adapter", r=16, alpha=32, targets=("q_proj", "v_proj"), base_model="m",
                            base_hash="sum128:" + "0" * 32)
        text = status_markdown(status.model_copy(update={"lora": lora, "trainable": 4_900_000,
                                                          "parameters": 139_400_000}))
        assert ("**LoRA r 16 (alpha 32) on q_proj, v_proj, published as the adapter alone** · 4,900,000 trainable "
                "parameters of 139,400,000 (3.52 %)") in text
        merged = status.model_copy(update={"lora": lora.model_copy(update={"sync": "merged"})})
        assert "**LoRA r 16 (alpha 32) on q_proj, v_proj, published as merged into the base**" in status_markdown(merged)
    finally:
        session.close()


def test_a_lora_runs_figures_say_whether_they_show_the_adapter_or_the_merged_weights(tmp_path) -> None:
    """Adapter mode: the heatmap has a column per projection and matrix, the titles say "adapter tensors, fp32" and
    the flat line is the whole adapter; merged mode: the checkpoint's tensors, "merged weights, bf16"."""
    from models import build_tiny_qwen3
    from tests._engines import step
    from tests._lora import peft_model, settings
    from tests._trainer_stack import wait_until
    from trainer_space.lora import adapter_tensors

    model = build_tiny_qwen3(str(tmp_path / "model"))
    for sync, what, dense, column in (("adapter", "adapter tensors, fp32", "whole adapter", "q_proj.lora_B"),
                                      ("merged", "merged weights, bf16", "dense model", "q_proj")):
        session = build_session(TrainerConfig(str(tmp_path / sync), None, model, lora_r=4,
                                                lora_sync=sync))
        parts = session.load()
        try:  # what the run publishes once TRL wrapped its model: the adapter (float32), or the merged weights
            state = (adapter_tensors(peft_model(model, settings(model))) if sync == "adapter" else parts.published)
            parts.publisher.publish(state)
            assert parts.publisher.flush(30)
            names = [n for n in state if "layers.1.self_attn.q_proj" in n and "lora_A" not in n]
            parts.publisher.publish(step(state, names, seed=1, lr=1e-2))
            assert parts.publisher.flush(30)
            wait_until(lambda: session.payloads.records, 15, "the payload log to measure version 2")
            _, payload, heatmap, _ = figures(session)
        finally:
            session.close()
        assert payload.layout.title.text.replace("<br>", " ").startswith(f"Bytes published per step: {what}")
        assert dense in [t.name for t in payload.data]
        assert heatmap.layout.title.text.replace("<br>", " ").startswith(f"Delta v1→v2 published ({what}) <sup>")
        assert column in list(heatmap.data[0].x)
