import threading

import pytest

from env_space.history import HUMAN, GameHistory, GameRecord, PlayerStats, player_label, weight_version_of


def record(player: str, won: bool, n: int = 0) -> GameRecord:
    return GameRecord(f"e{n}", player, ("crane",), ("GGGGG" if won else "XXXXX",), won, "crane", 0, 1.0, 0.0)


def test_player_label_and_back() -> None:
    assert player_label(3) == "policy v3"
    assert player_label(None) == "policy"
    assert [weight_version_of(p) for p in ("policy v3", "policy", HUMAN, "policy vx")] == [
        3,
        None,
        None,
        None,
    ]
    assert PlayerStats("policy v12", 1, 0).weight_version == 12
    with pytest.raises(ValueError, match="weight_version must be >= 0"):
        player_label(-1)


def test_stats_by_player_sorted_by_version() -> None:
    history = GameHistory()
    for player, won in [
        ("policy v10", True),
        ("policy v2", False),
        ("policy v2", True),
        (HUMAN, True),
        ("policy", False),
    ]:
        history.add(record(player, won))
    assert history.stats() == [
        PlayerStats(HUMAN, 1, 1),
        PlayerStats("policy v2", 2, 1),
        PlayerStats("policy v10", 1, 1),
        PlayerStats("policy", 1, 0),
    ]
    assert history.stats()[1].win_rate == 0.5
    assert PlayerStats("policy v1", 0, 0).win_rate == 0.0


def test_recent_is_bounded_newest_first_but_counts_everything() -> None:
    history = GameHistory(keep=3)
    for n in range(5):
        history.add(record(HUMAN if n == 4 else "policy v1", True, n))
    assert [r.episode_id for r in history.recent()] == ["e4", "e3", "e2"]
    assert [r.episode_id for r in history.recent(policy_only=True)] == ["e3", "e2"]
    assert [r.episode_id for r in history.recent(limit=1)] == ["e4"]
    assert history.finished == 5
    assert sum(s.games for s in history.stats()) == 5


def test_concurrent_adds_are_all_counted() -> None:
    history = GameHistory(keep=10)
    threads = [
        threading.Thread(target=lambda: [history.add(record("policy v1", True)) for _ in range(500)])
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert history.finished == 4000 and history.stats() == [PlayerStats("policy v1", 4000, 4000)]
