"""The documentation stays a product's: a README that fits a few screens, no development history,
every alert and page where the site expects it (the site itself is built strictly by make docs)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# Words that belong to how the project was built, not to what it is.
HISTORY = re.compile(r"\bsittings?\b", re.I)


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    paths = [ROOT / name for name in listed.decode().split("\0") if name]
    return [path for path in paths if path.is_file() and path.suffix not in {".png", ".ico", ".woff2"}]


def test_the_readme_fits_a_few_screens() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 150
    assert lines[0] == "# fastlane" and "make demo" in lines[3] and "make test" in lines[4]


def test_no_file_speaks_of_development_sittings() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in tracked_text_files()
        if path.name != "test_docs.py"
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert found == []


def test_every_page_of_the_site_is_in_its_navigation() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    # The !!python/name tag of a Mermaid fence is for MkDocs; it is not needed to read the nav.
    nav = yaml.safe_load(re.sub(r"!!python/name:\S+", "null", config))["nav"]

    def pages(entries: list) -> list[str]:
        found: list[str] = []
        for entry in entries:
            for value in entry.values() if isinstance(entry, dict) else [entry]:
                found.extend(pages(value) if isinstance(value, list) else [value])
        return found

    listed = pages(nav)
    on_disk = sorted(str(path.relative_to(ROOT / "docs")) for path in (ROOT / "docs").rglob("*.md"))
    assert sorted(listed) == on_disk
