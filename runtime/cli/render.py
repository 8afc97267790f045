"""The one renderer of a run's step table, and the small text helpers every view shares.

A run's steps reach the CLI in two shapes: StepRecord (in a RunResult, and in a Trace, which
keeps the same rounds) and TrailStep (read back from Temporal history by `conductor history`).
Each is adapted into a StepRow, and `steps_table` draws rows as one Rich table; a view picks the
columns it shows. So the column names, cell formats and escaping are written once.

Escaping rule for every CLI module: text that is not a literal of ours (a question, an answer,
an id, a path, an error message) reaches Rich as `rich.text.Text` or through
`rich.markup.escape`, never inside a markup string as is: `[/code]` in a question must print,
not crash, and `[link=...]` must not become a link.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from conductor_engine.engine.contracts.plans import sees_label
from conductor_engine.engine.text import shorten

if TYPE_CHECKING:
    from conductor_engine.engine.contracts.records import RoundRecord
    from conductor_engine.engine.contracts.rewards import Reward
    from conductor_engine.runtime.history import AttemptError, TrailRound

SHORT = 300
"""How many characters of a text a view shows unless asked for it in full (--full)."""


_MARKDOWN_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def markdown_literal(text: str) -> str:
    """`text` for a Markdown document of ours, shown as written: every ASCII punctuation
    character backslash-escaped (CommonMark), so `*`, `[x](url)` or `<b>` stay characters;
    a line break becomes a space."""
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", " ".join(text.splitlines()))


def reward_line(reward: Reward) -> Text:
    """`reward: VALUE (why) · rule: 1 right · 0.5 wrong · 0 no valid plan`, the value green when
    the answer counts as correct: a 0.5 reads as "a wrong answer from a well-formed plan"."""
    if reward.value is None:
        return Text(f"reward: none ({reward.reason})")
    colour = "green" if reward.value >= reward.weights.correct else "yellow"
    return Text.assemble("reward: ", (f"{reward.value:g}", f"bold {colour}"),
                         f" ({reward.reason})", (f" · rule: {reward.weights.rule()}", "dim"))


def attempt_errors(errors: list[AttemptError]) -> str:
    """How each failed attempt failed, one `#N: message` line each."""
    return "\n".join(f"#{e.attempt or '?'}: {e.message}" for e in errors)


@dataclass(frozen=True)
class StepRow:
    """One step as a step table shows it, whichever record it came from."""

    round: int  # 0-based, as in records
    index: int  # 0-based
    steps: int  # how many steps its round has
    agent: str
    subtask: str
    sees: str  # the earlier steps it was given: sees_label
    status: str
    output: str  # what it answered, or (in a record) why it failed
    input_tokens: int
    output_tokens: int
    cost_usd: float
    seconds: float
    attempts: int
    self_call: bool
    errors: str = ""  # how each failed attempt failed (history only)


def record_rows(rnd: RoundRecord) -> list[StepRow]:
    """A round of a RunResult or Trace. What a step sees is the earlier steps its access list
    came to ("none" for a first step granted "all"), as `conductor history` shows it."""
    return [
        StepRow(round=rnd.index, index=s.index, steps=len(rnd.steps), agent=s.agent,
                subtask=s.subtask, sees=sees_label(s.sees),
                status=s.status, output=s.error or s.output, input_tokens=s.usage.input_tokens,
                output_tokens=s.usage.output_tokens, cost_usd=s.cost_usd, seconds=s.seconds,
                attempts=s.attempts, self_call=bool(s.child_workflow_id))
        for s in rnd.steps
    ]


def trail_rows(rnd: TrailRound) -> list[StepRow]:
    """A round of a Trail (Temporal history): steps still pending or running included."""
    return [
        StepRow(round=rnd.index, index=s.index, steps=len(rnd.steps), agent=s.agent,
                subtask=s.subtask, sees=sees_label(s.sees), status=s.status,
                output=s.output or "", input_tokens=s.usage.input_tokens,
                output_tokens=s.usage.output_tokens, cost_usd=s.cost_usd, seconds=s.seconds,
                attempts=s.attempts, self_call=bool(s.child_workflow_id),
                errors=attempt_errors(s.errors))
        for s in rnd.steps
    ]


Column = Literal["round", "step", "agent", "subtask", "sees", "status", "output", "tokens",
                 "cost", "seconds", "attempts", "errors"]

HEADERS: dict[Column, str] = {"tokens": "tokens in/out", "cost": "cost $", "seconds": "s"}


def _cell_text(row: StepRow, column: Column, limit: int | None) -> str:
    """A cell as plain text (printed as Rich Text: never read as markup)."""
    match column:
        case "round":
            return str(row.round + 1)
        case "step":
            return f"{row.index + 1}/{row.steps}"
        case "subtask" | "output":
            return shorten(getattr(row, column), limit)
        case "tokens":
            return f"{row.input_tokens}/{row.output_tokens}"
        case "cost":
            return f"{row.cost_usd:.4f}"
        case "seconds":
            return f"{row.seconds:.1f}"
        case "attempts":
            return str(row.attempts) + (" (self-call)" if row.self_call else "")
        case _:
            return str(getattr(row, column))


DROP_FIRST: tuple[Column, ...] = ("cost", "round", "attempts", "seconds", "tokens", "errors",
                                  "status")
"""The step table's columns a narrow terminal loses first, in this order: a word is never split
across lines while a column can still go (agent, subtask, what it sees and answered stay)."""
TEXT_COLUMNS: frozenset[Column] = frozenset({"subtask", "output", "errors"})


def steps_table(rows: Sequence[StepRow], columns: Sequence[Column], *,
                limit: int | None = None, title: str | None = None) -> Fitted:
    """The step table: `columns` in that order; subtasks and outputs shortened to `limit`; at
    the console's width, low-priority columns left out before any word would be split."""
    return Fitted(title, [HEADERS.get(c, c) for c in columns],
                  [[_cell_text(row, c, limit) for c in columns] for row in rows],
                  drop=[HEADERS.get(c, c) for c in DROP_FIRST if c in columns],
                  text=[HEADERS.get(c, c) for c in columns if c in TEXT_COLUMNS])


# --- tables that fit the terminal -----------------------------------------------------------


def _longest_word(text: str) -> int:
    return max((cell_len(w) for w in text.split()), default=0)


def column_widths(headers: Sequence[str], rows: Sequence[Sequence[str]],
                  width: int, caps: Sequence[int | None] | None = None,
                  whole: Sequence[bool] | None = None) -> list[int] | None:
    """Widths for a Rich table of these cells at `width` columns, each column at least as wide
    as its longest word (so cells wrap at spaces, never inside a word; `caps`: a column of
    free text needs no more than its cap, a longer word in it is folded) and at most its
    widest line, the room left shared in proportion to what each column lacks; None when even
    the least widths do not fit; `whole`: a column that must not wrap at all (its least is its
    widest line). A table takes one space of padding either side of a cell and a rule between
    columns and at each edge: 3 per column and 1."""
    columns = list(zip(headers, *rows, strict=True))
    least = [max(1, *(_longest_word(c) for c in column)) for column in columns]
    if caps is not None:
        least = [n if cap is None else min(n, cap) for n, cap in zip(least, caps, strict=True)]
    most = [max(least[i], *(cell_len(line) for c in column for line in c.splitlines() or [""]))
            for i, column in enumerate(columns)]
    if whole is not None:
        least = [m if w else n for n, m, w in zip(least, most, whole, strict=True)]
    room = width - 3 * len(headers) - 1
    if sum(least) > room:
        return None
    if sum(most) <= room:
        return most
    spare, lacking = room - sum(least), [m - n for m, n in zip(most, least, strict=True)]
    share = [spare * lack // sum(lacking) for lack in lacking]
    widths = [n + s for n, s in zip(least, share, strict=True)]
    for i in sorted(range(len(widths)), key=lambda i: lacking[i] - share[i], reverse=True):
        if sum(widths) >= room:
            break
        widths[i] += 1  # what the rounding down left over, to those who lack most
    return widths


def records(headers: Sequence[str], row: Sequence[str], width: int) -> Text:
    """One row as a block for a narrow terminal: its first cell as a heading, then one
    `header: value` line per other non-empty cell, wrapped at spaces (a word wider than the
    terminal stays whole on a line of its own)."""
    lines = [row[0]]
    for header, cell in zip(headers[1:], row[1:], strict=True):
        if not cell:
            continue
        wrapped = textwrap.wrap(f"{header}: {cell}", max(20, width - 2), break_long_words=False,
                                break_on_hyphens=False, subsequent_indent="    ")
        lines += [f"  {line}" for line in wrapped]
    return Text("\n".join(lines))


def fitted_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
                 width: int) -> list[RenderableType]:
    """What to print for a table of plain-text cells at `width` columns: the table, when it
    fits without splitting a word (column_widths), else the title and one block per row
    (`records`), a blank line between. Print each with soft_wrap=True: the blocks are wrapped
    already and must not be folded again."""
    widths = column_widths(headers, rows, width)
    if widths is not None:
        table = Table()
        for header, w in zip(headers, widths, strict=True):
            table.add_column(header, width=w, overflow="fold")
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))
        return [Text(title), table]  # the title on a line of its own: a long path never folds
    out: list[RenderableType] = [Text(title)]
    for row in rows:
        out += [Text(""), records(headers, row, width)]
    return out


TEXT_CAP = 16
"""The narrowest a column of free text (a subtask, a question) gets before columns are dropped:
a longer word in it (a model's run-on token, a URL) is folded, not allowed to crowd out the
table."""


class Fitted:
    """A table of plain-text cells that fits the console it is printed on, decided when it is
    rendered (so one value prints right at 80 columns and at 200): the whole table when it fits
    without splitting a word (column_widths); else without the columns of `drop`, in order, one
    at a time; else one block per row (`records`). Columns named in `text` hold free text: they
    wrap, and give way down to TEXT_CAP before any column is dropped."""

    def __init__(self, title: str | Text | None, headers: Sequence[str],
                 rows: Sequence[Sequence[str]], *, drop: Sequence[str] = (),
                 text: Sequence[str] = ()) -> None:
        self.title, self.headers, self.rows = title, list(headers), [list(r) for r in rows]
        self.drop, self.text = list(drop), set(text)

    def layout(self, width: int) -> tuple[list[int], list[int]] | None:
        """The kept columns' indices and their widths at `width`; None: no table fits."""
        kept = list(range(len(self.headers)))
        dropping = [self.headers.index(h) for h in self.drop if h in self.headers]
        while True:
            headers = [self.headers[i] for i in kept]
            cells = [[row[i] for i in kept] for row in self.rows]
            caps = [TEXT_CAP if h in self.text else None for h in headers]
            short = [h not in self.text for h in headers]
            # short columns whole, free text taking the rest; else short ones wrapped at spaces
            widths = (column_widths(headers, cells, width, caps, whole=short)
                      or column_widths(headers, cells, width, caps))
            if widths is not None:
                return kept, widths
            if not dropping:
                return None
            kept.remove(dropping.pop(0))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        title = Text(self.title) if isinstance(self.title, str) else self.title
        width = options.max_width
        fit = self.layout(width)
        if fit is None:  # the title above each block's heading; the blocks are wrapped already
            if title is not None:
                yield title
            for row in self.rows:
                yield Text("")
                yield records(self.headers, row, width)
            return
        kept, widths = fit
        table = Table()
        for i, w in zip(kept, widths, strict=True):
            table.add_column(self.headers[i], width=w, overflow="fold")
        for row in self.rows:
            table.add_row(*(Text(row[i]) for i in kept))
        if title is not None:  # on a line of its own: a long title never folds into the table
            yield title
        yield table
