import re

from dashboard.render import (
    KIND_LABELS,
    board_html,
    feed_html,
    keyboard_html,
    stats_rows,
    status_text,
    win_rate_curve,
    win_rate_note,
)
from wire.env import GameKind, GameRecord, GuessRow, PlayerStats, WordleObservation


def rows(*pairs: tuple[str, str]) -> list[GuessRow]:
    return [GuessRow(word=w, marks=m) for w, m in pairs]


def test_board_has_six_rows_of_five_tiles_coloured_by_mark() -> None:
    html = board_html(rows(("slate", "XXGXG"), ("crane", "GGGGG")))
    assert html.count('class="wordle-row"') == 6
    assert html.count('class="wordle-tile') == 30
    assert re.findall(r'data-mark="(\w)">(\w)<', html)[:5] == [
        ("X", "s"),
        ("X", "l"),
        ("G", "a"),
        ("X", "t"),
        ("G", "e"),
    ]
    assert html.count("wordle-tile green") == 7 and html.count("wordle-tile gray") == 3


def test_keyboard_shows_the_best_mark_per_letter() -> None:
    html = keyboard_html(rows(("slate", "YXXXX"), ("spine", "GXXXX")))
    assert 'class="wordle-key green" data-key="s"' in html
    assert 'class="wordle-key gray" data-key="l"' in html
    assert 'class="wordle-key " data-key="q"' in html
    assert html.count("data-key=") == 26 + 2  # letters, enter and back


def test_status_text_for_a_person() -> None:
    base = {"episode_id": "e", "player": "human", "message": "", "guesses_left": 5}
    assert status_text(None) == "Press **New game** to start."
    assert status_text(WordleObservation(**base)) == "5 guesses left."
    bad = WordleObservation(**base, error="'xyzzy' is not in the word list")
    assert status_text(bad) == "Not accepted: &#x27;xyzzy&#x27; is not in the word list. 5 guesses left."
    won = WordleObservation(
        **{**base, "guesses_left": 4},
        rows=rows(("slate", "XXXXX"), ("crane", "GGGGG")),
        won=True,
        done=True,
        secret="crane",
    )
    assert status_text(won) == "You won in 2! The word was **CRANE**."
    lost = WordleObservation(**{**base, "guesses_left": 0}, done=True, secret="crane")
    assert status_text(lost) == "Game over. The word was **CRANE**."


def test_feed_lists_policy_games_newest_first() -> None:
    assert "No policy games yet." in feed_html([])
    games = [
        GameRecord(episode_id="a", player="policy v7", words=("slate", "crane"), marks=("XXGXG", "GGGGG"), won=True,
                   secret="crane", invalid_moves=0, total_reward=1.7, finished_at=100.0),
        GameRecord(episode_id="b", player="policy v6", words=("fjord",) * 6, marks=("XXXYX",) * 6, won=False,
                   secret="crane", invalid_moves=2, total_reward=-0.1, finished_at=90.0),
        GameRecord(episode_id="c", player="policy v5", words=(), marks=(), won=False, secret="<b>", invalid_moves=1,
                   total_reward=-0.2, finished_at=90.0, replies=("<i>" + "x " * 60,), guesses=("",),
                   errors=("'<i>' must contain only the letters a-z",)),
        GameRecord(episode_id="d", player="policy v5", words=(), marks=(), won=False, secret="", invalid_moves=6,
                   total_reward=-0.6, finished_at=90.0, finished=False),
    ]
    html = feed_html(games)
    assert html.index("policy v7") < html.index("policy v6")
    assert "won in 2" in html and "ended 00:01:40 UTC" in html  # each game's own end, not a frozen age
    assert "lost (CRANE), 2 invalid moves" in html and "ended 00:01:30 UTC" in html
    assert "lost (&lt;B&gt;), 1 invalid move<" in html  # escaped
    assert "unfinished, 6 invalid moves" in html
    move = re.search(r'<li class="wordle-move invalid" title="([^"]*)">([^<]*)<div class="wordle-why">([^<]*)</div>'
                     r'</li>', html)
    assert move and move.group(2) == "1. invalid: &lt;i&gt;" + "x " * 59 + "x"  # what the model wrote, whole
    assert move.group(1).startswith("&lt;i&gt;x x")  # the whole text on hover
    assert move.group(3) == "&#x27;&lt;i&gt;&#x27; must contain only the letters a-z"  # and why it was refused


def test_a_long_reply_shows_the_word_the_env_scored() -> None:
    """A reply cut at its start dropped the guess at its end: the feed keeps the text around the last tag."""
    reply = "Let me think about which letters could be in the word. " * 5 + "<guess>slate</guess>"
    game = GameRecord(episode_id="a", player="policy v3", words=("slate",), marks=("XXGXG",), won=False,
                      secret="crane", invalid_moves=0, total_reward=0.2, finished_at=100.0, replies=(reply,),
                      guesses=("slate",))
    [move] = re.findall(r"<li[^>]*>(.*?)</li>", feed_html([game]))
    assert move.startswith("1. <b>SLATE</b>: …") and move.endswith("&lt;guess&gt;slate&lt;/guess&gt;")


def test_a_word_copied_from_the_envs_example_is_marked_as_such() -> None:
    game = GameRecord(episode_id="a", player="policy v3", words=("crane", "stood", "fjord"),
                      marks=("XXXXY", "XXYXG", "XXYXX"), won=False, secret="doped", invalid_moves=1,
                      total_reward=0.1, finished_at=100.0,
                      replies=("<guess>crane</guess>", "<guess>stood</guess>", "<guess>x", "<guess>fjord</guess>"),
                      guesses=("crane", "stood", "", "fjord"), errors=("", "", "'x' has 1 letter", ""),
                      examples=("crane", "stood", "mound", "plaza"))
    moves = re.findall(r"<li[^>]*>(.*?)</li>", feed_html([game]))
    marked = [m.startswith(f"{n}. <b>") and "(env&#x27;s example)" in m for n, m in enumerate(moves, 1)]
    assert marked == [True, True, False, False]  # copies marked; an invalid move and an own word are not
    old = game.model_copy(update={"examples": ()})  # records from before the env showed examples
    assert "example" not in feed_html([old])


def test_a_word_copied_from_the_instructions_is_marked_as_copied() -> None:
    """GREEN is a word of the instructions ("green: the letter is in the word"), not the example: the env marks the move
    copied, and the feeds say so; a word no message showed stays unmarked."""
    from env_space.game import WordleGame
    from env_space.words import load_word_lists
    from dashboard.games import feed_html as policy_feed_html
    from wire.trajectory import Trajectory

    game = WordleGame("mound", load_word_lists(), episode_id="g", player="policy v3")
    for reply in ("<guess>green</guess>", "<guess>fjord</guess>"):
        game.step(reply)
    record = game.record()
    assert record.copied == (True, False) and record.examples[0] != "green"
    for html in (feed_html([record]), policy_feed_html([Trajectory(
            prompt_ids=[1], episode_id="g", replies=list(record.replies), guesses=list(record.guesses),
            examples=list(record.examples), copied=list(record.copied), marks=list(record.marks))])):
        moves = re.findall(r"<li[^>]*>(.*?)</li>", html)
        assert ["(copied from the env&#x27;s text)" in m for m in moves] == [True, False]
        assert "env&#x27;s example" not in html


def test_stats_rows_and_win_rate_curve_keep_each_kind_of_game_apart() -> None:
    stats = [
        PlayerStats(player="human", games=2, wins=2),
        PlayerStats(player="policy v10", kind=GameKind.TRAINING, games=4, wins=3),
        PlayerStats(player="policy v10", kind=GameKind.SHOWCASE, games=1, wins=1),
        PlayerStats(player="policy v2", kind=GameKind.TRAINING, games=3, wins=1),
        PlayerStats(player="policy v2", kind=GameKind.EXAM, games=16, wins=0),
        PlayerStats(player="policy", games=1, wins=1),
    ]
    assert stats_rows(stats[3:4]) == [["policy v2", "training", 3, 1, "33%"]]  # a share, not 0.333 (or 1 and 0)
    assert [row[:2] for row in stats_rows(stats)] == [
        ["human", "play"], ["policy v10", "training"], ["policy v10", "showcase"], ["policy v2", "training"],
        ["policy v2", "exam"], ["policy", "play"]]
    assert win_rate_curve(stats) == [
        ["v2", 0.0, "exam"],
        ["v2", 0.333, "training"],
        ["v10", 1.0, "showcase"],
        ["v10", 0.75, "training"],
    ]  # one line per kind, by version (labels: whole versions on the axis), people and unknown versions left out


def test_the_win_rate_note_counts_each_kind_and_says_what_a_flat_line_means() -> None:
    assert win_rate_note([]) == "*No policy game yet.*"
    people = PlayerStats(player="human", games=3, wins=3)
    flat = win_rate_note([people, PlayerStats(player="policy v1", kind=GameKind.TRAINING, games=8, wins=0),
                          PlayerStats(player="policy v2", kind=GameKind.TRAINING, games=8, wins=0),
                          PlayerStats(player="policy v2", kind=GameKind.SHOWCASE, games=2, wins=1)])
    assert flat.startswith("*training games: 0 of 16 won · showcase games: 1 of 2 won. The training line lies on 0")
    won = win_rate_note([PlayerStats(player="policy v2", kind=GameKind.TRAINING, games=8, wins=1)])
    assert won == "*training games: 1 of 8 won.*"


def test_the_env_feed_names_each_game_s_kind_and_its_examples() -> None:
    base = dict(player="policy v0", words=(), marks=(), won=False, secret="crane", invalid_moves=3,
                total_reward=-0.3, finished_at=1.0, finished=False, replies=("x",) * 3, guesses=("",) * 3)
    records = [GameRecord(episode_id=kind.value, kind=kind, examples=examples, **base) for kind, examples in (
        (GameKind.EXAM, ("", "", "")), (GameKind.TRAINING, ("crane", "", "filly")), (GameKind.SHOWCASE, ()))]
    html = feed_html(records)
    assert re.findall(r'data-kind="(\w+)">([^<]*)<', html) == [(k.value, KIND_LABELS[k]) for k in (
        GameKind.EXAM, GameKind.TRAINING, GameKind.SHOWCASE)]
    assert "no example shown" in html and "example in 2 of 3 messages" in html
