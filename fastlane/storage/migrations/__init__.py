"""Versioned schema migrations, one directory of numbered SQL files per dialect."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations_for(dialect: str) -> list[Migration]:
    """Every migration of ``dialect`` ('postgres' or 'sqlite'), oldest first."""
    folder = resources.files(__package__).joinpath(dialect)
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            number, _, rest = entry.name.partition("_")
            found.append(Migration(int(number), rest.removesuffix(".sql"), entry.read_text()))
    found.sort(key=lambda migration: migration.version)
    versions = [migration.version for migration in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"{dialect} migrations are not numbered 1..n without gaps: {versions}")
    return found
