"""MkDocs hooks: the project files kept at the repository's root, shown as pages of the site.

CHANGELOG.md, CONTRIBUTING.md and SECURITY.md live at the root, where people and tools look for
them, and link into docs/ from there. A page under docs/project/ that holds only
``--8<-- "FILE"`` becomes FILE's text, its links rewritten to work from that page, so the site's
strict link check covers them too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = re.compile(r'^--8<-- "([A-Z]+\.md)"\s*$')
# The root files' names as pages of docs/project/ (each page sits beside the others).
PAGES = {"CHANGELOG.md": "changelog.md", "CONTRIBUTING.md": "contributing.md", "SECURITY.md": "security.md"}
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def _from_project_page(target: str) -> str:
    if target in PAGES:
        return PAGES[target]
    if target.startswith("docs/"):
        return "../" + target.removeprefix("docs/")
    return target


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    included = INCLUDE.match(markdown.strip())
    if included is None:
        return markdown
    text = (ROOT / included.group(1)).read_text()
    return LINK.sub(lambda m: f"]({_from_project_page(m.group(1))}{m.group(2) or ''})", text)
