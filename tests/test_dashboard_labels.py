from dashboard.labels import GLOSSARY, counted, public_location


def test_labels_hide_local_paths_and_count_right(tmp_path) -> None:
    assert (counted(1, "sync"), counted(2, "sync"), counted(1_000, "match", "matches")) == (
        "1 sync", "2 syncs", "1,000 matches")
    assert public_location("/tmp/pytest-7/bucket") == "local folder …/bucket"
    assert public_location(".cache/models/smollm2/") == "local folder …/smollm2"
    assert public_location(str(tmp_path)) == f"local folder …/{tmp_path.name}"
    assert public_location("s3://team/runs/a") == "s3://team/runs/a"
    assert public_location(None) == "—"  # the pages' one sign for no value, never a "-" beside their "—"
    assert public_location("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert all(f"**{term}**" in GLOSSARY for term in ("anchor", "density", "ctx", "staleness bound"))


def test_the_glossary_covers_the_words_of_the_fleet_tables_and_the_feeds() -> None:
    terms = ("showcase game", "unfinished", "env's example", "producing", "full", "gone", "idle", "refused groups",
             "published", "applied here", "versions behind")
    assert [t for t in terms if f"**{t}**" not in GLOSSARY] == []
    assert "first word after the *last* `<guess>` tag" in GLOSSARY  # the rule as env_space.prompt applies it


def test_a_lora_runs_published_state_in_words() -> None:
    from dashboard.labels import published_state

    assert published_state(None, ["bfloat16"]) is None  # a full run: the pages say weights, as ever
    assert published_state("adapter", ["float32", "float32"]) == "adapter tensors, fp32"
    assert published_state("merged", ["bfloat16", "float32"]) == "merged weights, bf16/fp32"
    assert published_state("merged") == "merged weights"  # nothing published yet: no dtype to tell
