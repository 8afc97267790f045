"""Model-written text shown to people: on one line and bounded, wherever it is shown (the CLI's
tables, a run's Markdown summary, a verifier's reason)."""

from __future__ import annotations


def shorten(text: str, limit: int | None) -> str:
    """`text` on one line and at most `limit` characters (… marks a cut); None: unchanged."""
    if limit is None:
        return text
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
