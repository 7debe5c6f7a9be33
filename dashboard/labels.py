"""Words the public pages share: counts with their plural, locations safe to show a visitor, and the
glossary of the terms the pages use.

Pure Python (no plotly, no Gradio): the launcher's landing page imports it without a UI stack.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """ "1 sync", "2 syncs", "0 games"."""
    return f"{n:,} {singular if n == 1 else plural or singular + 's'}"


def lora_label(sync: str, r: int, alpha: float, targets: tuple[str, ...]) -> str:
    """A LoRA run in words: "LoRA r 16 (alpha 32) on q_proj, k_proj, v_proj, published as the adapter alone"."""
    how = "the adapter alone" if sync == "adapter" else "merged into the base"
    return f"LoRA r {r} (alpha {alpha:g}) on {', '.join(targets)}, published as {how}"


#: Short dtype names for labels.
_SHORT_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def published_state(sync: str | None, dtypes: Iterable[str] = ()) -> str | None:
    """What a LoRA run's versions hold, for the titles of its heatmap and byte curves: "adapter tensors, fp32" or
    "merged weights, bf16" (`dtypes`: those of the published tensors, when known); None for a run without LoRA."""
    if sync is None:
        return None
    what = "adapter tensors" if sync == "adapter" else "merged weights"
    names = sorted({_SHORT_DTYPES.get(d, d) for d in dtypes})
    return f"{what}, {'/'.join(names)}" if names else what


def public_location(location: str | None) -> str:
    """A bucket or model as a visitor may see it: URLs (``s3://``, ``hf://``, ``https://``) and Hub ids
    as they are; a local path as "local folder …/NAME" (its last part, the "…/" saying that a path was cut), since
    the full path shows this machine's temporary and cache folders, which say nothing to a visitor and something
    to an attacker. Pages put a colon between their label and it ("bucket: local folder …/bucket")."""
    if not location:
        return "—"  # the pages' one sign for no value
    location = location.removeprefix("file://")  # a local folder as a URL: a path all the same
    if "://" in location:
        return location
    if not (os.path.isabs(location) or location.startswith((".", "~")) or os.path.exists(location)):
        return location  # a Hub id such as HuggingFaceTB/SmolLM2-135M-Instruct
    return f"local folder …/{os.path.basename(os.path.normpath(location))}"


def public_text(text: str | None, *locations: str | None) -> str | None:
    """`text` (an error, a note) with each local location among `locations` written as `public_location` writes it:
    a message about a file in the bucket names "local folder …/bucket/…", not this machine's folders."""
    if text is None:
        return None
    for location in locations:
        public = public_location(location)
        if location and public.startswith("local folder"):
            text = text.replace(location.removeprefix("file://").rstrip("/"), public)
    return text


#: A delta denser than this is said to be denser than a typical RL step's (about 1 %).
TYPICAL_DENSITY = 0.02


def density_note(density: float | None) -> str:
    """Under a sparsity heatmap: how dense the delta drawn is (its own figure, never a range quoted from another run),
    against a typical RL step, and why the demo's are denser when they are."""
    typical = (
        "A typical RL step (AdamW at ~1e-6 on bf16 weights) changes around 1 % of the elements, nearly all by "
        "one ULP: the case the codec is built for."
    )
    if density is None:
        return f"**How dense?** No delta yet. {typical}"
    said = f"**How dense?** This delta changed {100 * density:.3g} % of the elements. {typical}"
    if density > TYPICAL_DENSITY:
        said += (
            " This run's are denser: the demo trains at a higher learning rate (`--learning-rate`, 7e-5 by default, "
            "about 70× an RL run's) so that a small model moves within minutes on a CPU."
        )
    return said


#: What the pages' terms mean, as Markdown (the trainer and rollout UIs show it in an accordion).
GLOSSARY = """\
- **version**: one published state of the weights; the trainer publishes one per optimizer step.
- **delta**: the elements that changed since the previous version, as a sparse safetensors file.
- **anchor**: a full copy of the weights (the first version, then every N versions); a reader that
  is far behind loads the newest anchor and replays the deltas after it.
- **density**: the share of a tensor's elements that changed in one version (the heatmap's colour, on
  a fixed logarithmic scale so colours compare across versions; the note under it gives the delta's own
  figure). The demo's steps are denser than an RL run's: its default learning rate (7e-5) is ~70× an RL run's,
  so a small model moves within minutes on a CPU; a typical RL step (learning rate ~1e-6, AdamW, bf16
  weights) changes around 1 %, nearly all by one ULP.
- **ctx**: the default codec: positions as gaps, each new value coded relative to the old one the
  reader already holds, with the old value's exponent as the context of an entropy coder
  (0.15–0.97 bytes per changed element on real AdamW steps, against 6 for `raw`: int32 positions +
  bf16 values).
- **staleness bound**: how many versions a training game's weights may lag the trainer's; older
  games are played again, then dropped from the gradient.
- **guess**: what a reply plays, by the strict rule the env applies to everyone: `<think>` blocks are
  dropped, then the guess is the first word after the *last* `<guess>` tag, closed or not (`<guess>crane
  and more` plays CRANE); a reply with no tag counts only if it is one single word. No word is ever
  picked out of the text around it.
- **valid-guess rate**: the share of moves whose guess, read by that rule, is an allowed 5-letter word
  not guessed before in the game.
- **letters found**: per game, greens + yellows / 2 of its best guess (0-5).
- **move**, **invalid move**: a move is one reply; an invalid one (no guess, not a word, a repeat)
  costs no guess but a penalty, and the 7th ends the game lost, so a whole game holds up to 12 moves
  for its 6 guesses.
- **unfinished**: a training game cut after the trainer's `--max-turns` moves (3 by default, so that
  a CPU gets more steps per minute), before a win or a loss.
- **showcase game**: a whole game (up to 6 guesses) a rollout server plays on its own after a minute
  with no game, so its page always shows the current policy; never trained on.
- **env's example**: the example word the env's request showed before a move (never the secret); a
  move marked so copied it. A move marked **copied from the env's text** scored a word another message
  of the game had shown (a word of the instructions such as GREEN, or of the feedback).
- **policy v3**, **policy v2–v3**: the weight versions that wrote a game's replies (a game played
  while a new version arrived spans two).
- **published** (trainer) and **applied here** (rollout): the trainer's newest version committed to
  the bucket, and the version a rollout server has loaded and serves; **versions behind** is how
  far a server's version trails the bucket's newest.
- **fleet states** of a rollout server: **starting** (just started or restarted: loading, or replaying the bucket's
  versions up to the newest, which can take minutes; no version is shown until it is done), **producing** (playing
  groups of games for the run), **full** (enough groups wait in the bucket; it waits until the trainer takes some),
  **waiting for step 1** (it handed in the first step's games and lets that step train alone on the cores it
  shares), **paused** / **no run** (the trainer paused, or has written no run yet), **error** (its last batch
  failed; it retries), **gone** (no heartbeat for 30 s: stopped, killed or cut off).
- **idle**: the share of a server's time since it started with no game to play (full, paused, or
  waiting for the run).
- **refused groups**: game groups the trainer read and threw away without training on them: from
  another run (an earlier trainer process), torn or corrupt files, or games that fail the checks
  (token ids, logprobs, rewards out of range).
- **example**: the word a message of the env offers as an example guess. Training games show it with a
  probability that fades as training goes on (the trainer's `--examples`); exam games never show one.
- **exam**: every few versions, games on held-out secret words (never used in training), without examples,
  never trained on: what the policy plays by itself.
- **own word**: a scored word that no message of the game had shown before the move (not an example, not a
  word of the instructions such as GUESS). The exam's headline counts own words only.
- **copy-only player**: a reference that plays the example of every message (examples on): what copying
  alone finds.
"""
