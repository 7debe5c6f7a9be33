"""Real English text that every Python installation carries, so nothing is downloaded."""

from functools import lru_cache


@lru_cache(maxsize=1)
def english_text() -> str:
    """The Python language reference topics shipped with the stdlib (`pydoc_data`), ~450 kB.

    Real prose with code samples, deterministic for a given Python version: the text for
    tokenizer training and language-model steps when no data set can be downloaded.

    Raises:
        RuntimeError: if this Python was built without `pydoc_data` (some minimal distro builds).
    """
    try:
        from pydoc_data.topics import topics
    except ImportError as e:
        raise RuntimeError(
            "the stdlib module pydoc_data is missing from this Python; install the full standard "
            "library (on Debian/Ubuntu: the libpython3.X-stdlib package)"
        ) from e
    return "\n\n".join(topics[key] for key in sorted(topics))
