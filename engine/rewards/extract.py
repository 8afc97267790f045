"""Pulling the final answer out of a model's long reply, and normalising text for comparison.

Models wrap answers in reasoning; verifiers want the answer. These helpers find the forms models
actually use (`\\boxed{...}`, a final "Answer: ..." line, "the answer is (C)", a fenced code
block) and normalise text the way SQuAD's evaluation does.
"""

from __future__ import annotations

import re
import string
import unicodedata

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_TEXT_MACRO = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\s*\{([^{}]*)\}")
_ANSWER_LINE = re.compile(
    r"^[ \t>#*_]*(?:final[ \t]+)?answer[ \t*_]*[:：][ \t*_]*(?P<value>.+?)[ \t*_]*$",
    re.IGNORECASE | re.MULTILINE,
)
_ANSWER_IS = re.compile(r"\b(?:final\s+)?answer\s+is\s*:?\s*(?P<value>[^\n]+?)\s*(?:\.\s|\.?$)",
                        re.IGNORECASE | re.MULTILINE)
_FENCE = re.compile(r"```[ \t]*(?P<lang>[\w+#.-]*)[^\n]*\n(?P<code>.*?)```", re.DOTALL)
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_PUNCTUATION = set(string.punctuation) | {"“", "”", "‘", "’", "«", "»", "。", "，", "：", "–", "—"}


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`), nested braces included."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    start = starts[-1]
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i].strip()
    return None


def strip_latex_text(text: str) -> str:
    """`\\text{Paris}` → `Paris`: models box words in text macros."""
    return _TEXT_MACRO.sub(r"\1", text)


def answer_line(text: str) -> str | None:
    """The value of the last "Answer: X" line, or of the last "the answer is X" phrase."""
    found = [m for rx in (_ANSWER_LINE, _ANSWER_IS) for m in rx.finditer(text)]
    if not found:
        return None
    last = max(found, key=lambda m: m.start("value"))
    return last.group("value").strip()


def answer_candidates(text: str) -> list[str]:
    """What the reply's final answer may be, most explicit first: the last boxed value, the last
    "Answer:" line, then the whole reply."""
    found = []
    if (boxed := last_boxed(text)) is not None:
        found.append(strip_latex_text(boxed))
    if (line := answer_line(text)) is not None:
        found.append(strip_latex_text(line))
    found.append(text)
    return found


def normalize_text(text: str) -> str:
    """SQuAD-style: Unicode NFKC, lower case, punctuation and the articles a/an/the removed,
    whitespace collapsed. "The Eiffel Tower." and "eiffel tower" compare equal."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(" " if ch in _PUNCTUATION else ch for ch in text)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def last_code_block(text: str) -> str:
    """The program in a reply: the last ```python fenced block, else the last unlabelled fenced
    block, else the whole reply (a reply that is nothing but code)."""
    blocks = [(m.group("lang").lower(), m.group("code")) for m in _FENCE.finditer(text)]
    for wanted in ({"python", "py", "python3"}, {""}):
        matching = [code for lang, code in blocks if lang in wanted]
        if matching:
            return matching[-1]
    return text
