"""Model-written text shown to people: on one line and bounded, wherever it is shown (the CLI's
tables, a run's Markdown summary, a verifier's reason); and text normalised for comparison, the
way the `exact` verifier and the sim agents compare answers."""

from __future__ import annotations

import re
import string
import unicodedata

_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_PUNCTUATION = set(string.punctuation) | {"“", "”", "‘", "’", "«", "»", "。", "，", "：", "–", "—"}


def shorten(text: str, limit: int | None) -> str:
    """`text` on one line and at most `limit` characters (… marks a cut); None: unchanged."""
    if limit is None:
        return text
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def encodable(text: str) -> str:
    """`text` with lone surrogates (half of a UTF-16 pair: a JSON reply's `\\ud800` escape
    decodes to one, and no UTF-8 encoder accepts it) as U+FFFD, and a pair written as two
    characters joined into the one character it encodes. A model's reply passes through here
    before it goes anywhere: otherwise it could not cross the data converter, the activity would
    fail after the completion was paid for, and every retry would pay again."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def normalize_text(text: str) -> str:
    """SQuAD-style: Unicode NFKC, lower case, punctuation and the articles a/an/the removed,
    whitespace collapsed. "The Eiffel Tower." and "eiffel tower" compare equal."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(" " if ch in _PUNCTUATION else ch for ch in text)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())
