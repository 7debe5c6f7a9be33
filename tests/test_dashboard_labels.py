from dashboard.labels import GLOSSARY, counted, public_location, public_text


def test_labels_hide_local_paths_and_count_right(tmp_path) -> None:
    assert (counted(1, "sync"), counted(2, "sync"), counted(1_000, "match", "matches")) == (
        "1 sync", "2 syncs", "1,000 matches")
    assert public_location("/tmp/pytest-7/bucket") == "local folder …/bucket"
    assert public_location(".cache/models/smollm2/") == "local folder …/smollm2"
    assert public_location(str(tmp_path)) == f"local folder …/{tmp_path.name}"
    assert public_location("s3://team/runs/a") == "s3://team/runs/a"
    assert public_location(None) == "—"  # the pages' one sign for no value, never a "-" beside their "—"
    assert public_location("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert public_location("file:///tmp/pytest-7/bucket") == "local folder …/bucket"  # a folder as a URL
    assert public_location("local folder …/bucket") == "local folder …/bucket"  # said once: said the same again
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


def test_the_density_note_gives_the_delta_s_own_figure() -> None:
    """The note said "the demo's steps change 8–12 %" beside a heatmap reading 4.63 %: it now reads the delta's."""
    from dashboard.labels import density_note

    assert density_note(None).startswith("**How dense?** No delta yet. A typical RL step")
    dense = density_note(0.0463)
    assert dense.startswith("**How dense?** This delta changed 4.63 % of the elements.") and "7e-5" in dense
    sparse = density_note(0.009)
    assert "changed 0.9 % of the elements" in sparse and "denser" not in sparse  # no reason given for what is not so
    assert "8–12" not in dense + GLOSSARY


def test_an_error_names_local_folders_as_the_pages_do(tmp_path) -> None:
    bucket = str(tmp_path / "bucket")
    error = f"cannot read {bucket}/manifest.json: torn"
    assert public_text(error, f"file://{bucket}", "s3://x") == "cannot read local folder …/bucket/manifest.json: torn"
    assert public_text(None, bucket) is None and public_text("s3://x/y failed", "s3://x") == "s3://x/y failed"


def test_the_trainer_s_public_status_names_no_folder_of_this_machine(tmp_path) -> None:
    from trainer_space import TrainerConfig, build_session

    session = build_session(TrainerConfig(str(tmp_path / "bucket"), "http://127.0.0.1:1", str(tmp_path / "model")))
    try:
        status = session.status()
    finally:
        session.close()
    assert str(tmp_path) not in status.model_dump_json()
    assert (status.bucket, status.model) == ("local folder …/bucket", "local folder …/model")
