"""Words the public pages share: counts with their plural, locations safe to show a visitor, and the
glossary of the terms the pages use.

Pure Python (no plotly, no Gradio): the launcher's landing page imports it without a UI stack.
"""

from __future__ import annotations

import os


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """"1 sync", "2 syncs", "0 games"."""
    return f"{n:,} {singular if n == 1 else plural or singular + 's'}"


def public_location(location: str | None) -> str:
    """A bucket or model as a visitor may see it: URLs (``s3://``, ``hf://``, ``https://``) and Hub ids
    as they are; a local path as "local folder NAME" (its last part), since the full path shows this
    machine's temporary and cache folders, which say nothing to a visitor and something to an attacker."""
    if not location:
        return "-"
    if "://" in location:
        return location
    if not (os.path.isabs(location) or location.startswith((".", "~")) or os.path.exists(location)):
        return location  # a Hub id such as HuggingFaceTB/SmolLM2-135M-Instruct
    return f"local folder {os.path.basename(os.path.normpath(location))}"


#: What the pages' terms mean, as Markdown (the trainer and rollout UIs show it in an accordion).
GLOSSARY = """\
- **version**: one published state of the weights; the trainer publishes one per optimizer step.
- **delta**: the elements that changed since the previous version, as a sparse safetensors file.
- **anchor**: a full copy of the weights (the first version, then every N versions); a reader that
  is far behind loads the newest anchor and replays the deltas after it.
- **density**: the share of a tensor's elements that changed in one version (the heatmap's colour, on
  a fixed logarithmic scale so colours compare across versions).
- **ctx**: the default codec: positions as gaps, each new value coded relative to the old one the
  reader already holds, with the old value's exponent as the context of an entropy coder
  (0.4-0.9 bytes per changed element, against 6 for `raw`: int32 positions + bf16 values).
- **staleness bound**: how many versions a training game's weights may lag the trainer's; older
  games are played again, then dropped from the gradient.
- **valid-guess rate**: the share of moves whose guess, read by the strict rule (the first word
  after `<guess>`), is an allowed 5-letter word not guessed before in the game.
- **letters found**: per game, greens + yellows / 2 of its best guess (0-5).
- **example**: the word a message of the env offers as an example guess. Training games show it with a
  probability that fades as training goes on (the trainer's `--examples`); exam games never show one.
- **exam**: every few versions, games on held-out secret words (never used in training), without examples,
  never trained on: what the policy plays by itself.
- **own word**: a scored word that no message of the game had shown before the move (not an example, not a
  word of the instructions such as GUESS). The exam's headline counts own words only.
- **copy-only player**: a reference that plays the example of every message (examples on): what copying
  alone finds.
"""
