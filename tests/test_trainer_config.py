"""The trainer's settings: the KL guard reaches TRL, and a run with it trains against a reference model loaded
from the model folder (offline)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tests._trainer_stack import tiny_model
from trainer_space import TrainerConfig, build_session
from wire.rollout import Trajectory


class Games:
    """Stands in for the rollout: fixed tokens, rewards that differ within each group."""

    def rollout(self, games: Sequence[dict], **_: object) -> list[Trajectory]:
        return [Trajectory(prompt_ids=[5, 6, 7], episode_id=f"g{i}", completion_ids=[8, 9], logprobs=[-1.0, -1.0],
                           env_mask=[1, 1], reward=float(i % 2), versions=[0]) for i, _ in enumerate(games)]


def test_a_run_with_the_kl_guard_trains_against_the_model_folder(tmp_path) -> None:
    config = TrainerConfig(str(tmp_path / "bucket"), "http://unused", tiny_model(str(tmp_path / "model")),
                           games_per_step=4, num_generations=2, max_tokens=2, max_turns=1, max_steps=2, kl=0.5)
    assert config.grpo_config([1.0]).beta == 0.5 and TrainerConfig("b", None, "m").grpo_config([1.0]).beta == 0.0
    session = build_session(config, client=Games())
    try:
        trainer = session._trainer(session.load())
        assert trainer.ref_model is not None  # loaded from the folder, no Hub
        session.start()
        assert session.wait(300) and session.error is None and session.steps == 2
    finally:
        session.close()


@pytest.mark.parametrize("kl", [-0.1, 10.0])
def test_a_kl_weight_out_of_range_is_refused(kl: float) -> None:
    with pytest.raises(ValueError, match="kl must be >= 0"):
        TrainerConfig("b", None, "m", kl=kl)
