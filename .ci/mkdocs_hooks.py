"""MkDocs hook: a link from a docs page to a repository file outside docs/ becomes its name.

The site is built from docs/ alone, so `[text](../trainer/policy.py)` would be a dead link in
the built site and `mkdocs build --strict` would fail on it. A link to a file that exists is
shown as the path in code (`trainer/policy.py`), which is what a reader needs to open it in the
repository; a link to a file that does not exist is left alone, so the strict build still
fails on it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    here = (docs / page.file.src_path).parent

    def name_it(match: re.Match[str]) -> str:
        label, target = match.group(1), match.group(2)
        if re.match(r"^[a-z]+:|^#", target):
            return match.group(0)
        path = (here / target.split("#")[0]).resolve()
        if path.is_relative_to(docs) or not path.is_relative_to(root) or not path.exists():
            return match.group(0)
        repo_path = path.relative_to(root).as_posix() + ("/" if path.is_dir() else "")
        if label.startswith("`") and label.endswith("`"):
            return label
        return f"{label} (`{repo_path}`)"

    return LINK.sub(name_it, markdown)
