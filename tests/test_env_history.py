import threading

import pytest

from env_space.history import GameHistory
from wire.env import HUMAN, GameKind, GameRecord, PlayerStats, player_label, weight_version_of


def record(player: str, won: bool, n: int = 0) -> GameRecord:
    return GameRecord(episode_id=f"e{n}", player=player, words=("crane",), marks=("GGGGG" if won else "XXXXX",), won=won,
                      secret="crane", invalid_moves=0, total_reward=1.0, finished_at=0.0)


def test_player_label_and_back() -> None:
    assert player_label(3) == "policy v3"
    assert player_label(None) == "policy"
    assert [weight_version_of(p) for p in ("policy v3", "policy", HUMAN, "policy vx")] == [
        3,
        None,
        None,
        None,
    ]
    assert PlayerStats(player="policy v12", games=1, wins=0).weight_version == 12
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
        PlayerStats(player=HUMAN, games=1, wins=1),
        PlayerStats(player="policy v2", games=2, wins=1),
        PlayerStats(player="policy v10", games=1, wins=1),
        PlayerStats(player="policy", games=1, wins=0),
    ]
    assert history.stats()[1].win_rate == 0.5
    assert PlayerStats(player="policy v1", games=0, wins=0).win_rate == 0.0


def test_each_kind_of_game_is_counted_apart() -> None:
    history = GameHistory()
    for kind, won in [(GameKind.TRAINING, False), (GameKind.EXAM, False), (GameKind.SHOWCASE, True),
                      (GameKind.TRAINING, False), (GameKind.MATCH, True)]:
        history.add(record("policy v3", won).model_copy(update={"kind": kind}))
    history.add(record(HUMAN, True).model_copy(update={"kind": GameKind.MATCH}))
    assert [r.kind for r in history.recent(kind=GameKind.TRAINING)] == [GameKind.TRAINING] * 2
    assert [r.player for r in history.recent(policy_only=True, kind=GameKind.MATCH)] == ["policy v3"]
    assert history.stats() == [
        PlayerStats(player=HUMAN, kind=GameKind.MATCH, games=1, wins=1),
        PlayerStats(player="policy v3", kind=GameKind.TRAINING, games=2, wins=0),
        PlayerStats(player="policy v3", kind=GameKind.EXAM, games=1, wins=0),
        PlayerStats(player="policy v3", kind=GameKind.SHOWCASE, games=1, wins=1),
        PlayerStats(player="policy v3", kind=GameKind.MATCH, games=1, wins=1),
    ]


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
    assert history.finished == 4000 and history.stats() == [PlayerStats(player="policy v1", games=4000, wins=4000)]
