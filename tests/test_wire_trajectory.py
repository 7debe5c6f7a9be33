"""A game's weight versions: per reply, and per token where the engine reported them (vLLM's weight-version spans),
checked as the fleet's strangers' files are."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from wire.trajectory import Trajectory, VersionSpan


def game(**update) -> Trajectory:
    fields = dict(prompt_ids=[1], episode_id="g", completion_ids=[5, 6, 7, 8, 9, 10], logprobs=[-1.0] * 6,
                  env_mask=[1, 1, 0, 0, 1, 1], versions=[3, 4])
    return Trajectory(**{**fields, **update})


def test_each_token_has_the_version_of_its_span_and_the_game_its_oldest_token_s() -> None:
    spans = [VersionSpan(version=3, start=0, end=2), VersionSpan(version=3, start=4, end=5),
             VersionSpan(version=5, start=5, end=6)]  # the second reply straddled 3 and 5
    g = game(spans=spans, versions_reported=True, straddled=1)
    assert g.token_versions() == [3, 3, -1, -1, 3, 5]
    assert (g.version, g.newest_version) == (3, 5)
    assert Trajectory.model_validate_json(g.model_dump_json()) == g


def test_a_game_without_spans_gives_its_model_tokens_its_oldest_version() -> None:
    """Games written by servers that record no spans (before them): the conservative reading."""
    g = game()
    assert g.token_versions() == [3, 3, -1, -1, 3, 3] and (g.version, g.newest_version) == (3, 4)
    assert game(versions=[]).version == -1 == game(versions=[]).newest_version


@pytest.mark.parametrize("spans", [
    [(3, 0, 2), (3, 1, 3)],  # overlapping
    [(3, 4, 5), (3, 0, 2)],  # out of order
    [(3, 2, 2)],  # empty
    [(3, 5, 7)],  # past the completion
])
def test_spans_that_overlap_are_empty_or_run_past_the_completion_are_refused(spans) -> None:
    with pytest.raises(ValidationError, match=r"version span \[\d+, \d+\) is empty, out of order or past the 6 "
                                              r"completion tokens"):
        game(spans=[VersionSpan(version=v, start=s, end=e) for v, s, e in spans])
