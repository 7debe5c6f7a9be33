import threading

import pytest

from env_space.errors import InvalidSecretError, ServerFullError, SessionExistsError, SessionNotFoundError
from env_space.history import GameHistory
from env_space.sessions import SessionLimits, SessionStore
from env_space.words import load_word_lists


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_store(max_sessions: int = 3, idle_timeout_s: float = 60.0) -> tuple[SessionStore, FakeClock]:
    clock = FakeClock()
    store = SessionStore(
        load_word_lists(), GameHistory(), SessionLimits(max_sessions, idle_timeout_s), clock=clock
    )
    return store, clock


def test_full_store_refuses_with_a_clear_error() -> None:
    store, _ = make_store(max_sessions=2)
    store.start(player="human")
    store.start(player="human")
    with pytest.raises(ServerFullError) as info:
        store.start(player="human")
    assert (info.value.active, info.value.limit) == (2, 2)
    assert str(info.value).startswith("server full: 2 of 2 game sessions are in use")


def test_idle_games_expire_and_free_their_slot() -> None:
    store, clock = make_store(max_sessions=2, idle_timeout_s=60)
    start = clock.now
    old = store.start(player="human").episode_id
    clock.now = start + 30
    busy = store.start(player="human").episode_id
    clock.now = start + 50
    store.step(old, "slate")  # a move keeps a game alive
    clock.now = start + 89
    assert store.active == 2
    clock.now = start + 91  # 'busy' idle for 61 s, 'old' for 41 s
    assert store.active == 1
    with pytest.raises(SessionNotFoundError, match="finished, expired while idle, or never existed"):
        store.step(busy, "slate")
    store.start(player="human")  # the freed slot is usable
    clock.now = start + 109
    store.observe(old)  # reading does not count as activity
    clock.now = start + 111
    assert store.active == 1
    with pytest.raises(SessionNotFoundError):
        store.observe(old)


def test_finished_games_leave_and_are_recorded() -> None:
    store, _ = make_store()
    eid = store.start(player="policy v4", secret="crane").episode_id
    assert store.step(eid, "<guess>crane</guess>").done
    assert store.active == 0
    [record] = store.history.recent()
    assert (record.episode_id, record.player, record.won) == (eid, "policy v4", True)
    with pytest.raises(SessionNotFoundError):
        store.observe(eid)


def test_close_discard_and_own_ids() -> None:
    store, _ = make_store()
    eid = store.start(player="human", episode_id="mine").episode_id
    assert eid == "mine"
    with pytest.raises(SessionExistsError, match="'mine' is already in use"):
        store.start(player="human", episode_id="mine")
    store.close("mine")
    with pytest.raises(SessionNotFoundError):
        store.close("mine")
    assert store.discard("mine") is False
    assert store.history.finished == 0  # a person's closed game is not recorded


def test_a_policy_game_cut_by_its_client_is_recorded_as_unfinished() -> None:
    store, _ = make_store()
    silent = store.start(player="policy v2").episode_id
    store.close(silent)  # no move made: nothing to show
    eid = store.start(player="policy v2", secret="crane").episode_id
    store.step(eid, "I think <guess>zzzzz</guess>")
    store.step(eid, "<guess>slate</guess>")
    store.close(eid)
    [record] = store.history.recent()
    assert (record.episode_id, record.finished, record.won, record.invalid_moves) == (eid, False, False, 1)
    assert record.replies == ("I think <guess>zzzzz</guess>", "<guess>slate</guess>")
    assert record.guesses == ("", "slate")
    assert store.history.stats()[0].games == 1


def test_seed_and_secret_choose_the_word() -> None:
    store, _ = make_store()
    a = store.start(player="human", seed=5).episode_id
    b = store.start(player="human", seed=5).episode_id
    for eid in (a, b):
        for word in ("fjord", "pique", "bumpy", "whisk", "glyph", "vexed"):  # none is seed 5's secret
            obs = store.step(eid, word)
        assert obs.done
    assert (
        store.history.recent()[0].secret
        == store.history.recent()[1].secret
        == load_word_lists().pick_secret(5)
    )
    with pytest.raises(InvalidSecretError):
        store.start(player="human", secret="abc")


def test_threads_playing_many_games_never_mix_them() -> None:
    store = SessionStore(load_word_lists(), GameHistory(), SessionLimits(max_sessions=64))
    secrets = load_word_lists().answers[:64]
    errors: list[str] = []

    def play(secret: str) -> None:
        eid = store.start(player="policy v1", secret=secret).episode_id
        for guess in ("fjord", "slate", secret):
            obs = store.step(eid, guess)
            if obs.episode_id != eid:
                errors.append(f"{eid} got {obs.episode_id}")
        if not (obs.done and obs.won and obs.secret == secret):
            errors.append(f"{eid}: {obs}")

    threads = [threading.Thread(target=play, args=(s,)) for s in secrets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.history.stats()[0].wins == 64 and store.active == 0


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_sessions must be >= 1"):
        SessionLimits(max_sessions=0)
    with pytest.raises(ValueError, match="idle_timeout_s must be > 0"):
        SessionLimits(idle_timeout_s=0)
