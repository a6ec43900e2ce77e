"""Each storage rule is said once: the one store implements every Store method (its own and its
parts'), a dialect package implements none, and nothing outside ``fastlane/storage`` asks which
database it is on."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from fastlane.storage import base
from fastlane.storage.base import Store

ROOT = Path(__file__).resolve().parents[2] / "fastlane"
DIALECTS = ("sqlite", "postgres")


def members(protocol: type) -> set[str]:
    return {name for name, value in vars(protocol).items() if not name.startswith("__") and callable(value)
            or isinstance(value, property)}


def parts() -> dict[str, type]:
    """The parts a Store is composed of, by attribute: ``jobs`` -> JobStore, ..."""
    return {name: getattr(base, kind) for name, kind in Store.__annotations__.items() if kind.endswith("Store")}


def store_methods() -> set[str]:
    return members(Store).union(*(members(protocol) for protocol in parts().values()))


def functions_defined(package: Path) -> dict[str, list[str]]:
    """Every function and method name defined in the package, with where."""
    found: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.setdefault(node.name, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_the_store_protocol_is_read_as_expected() -> None:
    assert {"jobs", "lane", "attempts", "shards"} <= set(parts())
    assert {"create_job", "materialise_runs", "record_results", "acquire_shards", "migrate"} <= store_methods()


@pytest.mark.parametrize("dialect", DIALECTS)
def test_no_store_method_is_defined_in_a_dialect(dialect: str) -> None:
    defined = functions_defined(ROOT / "storage" / dialect)
    # Connection lifecycle that every Database has is not a Store rule.
    allowed = {"close", "write_fault", "write_fault_changed", "watch_changes", "server_epoch"}
    twice = {name: where for name, where in defined.items() if name in store_methods() - allowed}
    assert twice == {}, f"Store methods written in the {dialect} dialect: {twice}"


def test_every_store_method_is_implemented_by_the_one_store() -> None:
    from fastlane.storage.store import SQLStore

    missing = [name for name in members(Store) if getattr(SQLStore, name, None) is getattr(Store, name, None)]
    # Each part's class, read from the constructor's wiring (``self.jobs = SQLJobs(...)``).
    wiring = ast.parse((ROOT / "storage" / "store" / "__init__.py").read_text())
    built = {target.attr: call.func.id for node in ast.walk(wiring) if isinstance(node, ast.Assign)
             for target in node.targets if isinstance(target, ast.Attribute) and isinstance(call := node.value, ast.Call)
             and isinstance(call.func, ast.Name)}
    import fastlane.storage.store as store_package

    for name, protocol in parts().items():
        implementation = getattr(store_package, built[name])
        missing += [f"{name}.{method}" for method in members(protocol) if not hasattr(implementation, method)]
    assert missing == []


_DIALECT_CHECK = re.compile(
    r"isinstance\([^)]*(SQLite|Postgres)Store|\.dialect\b|==\s*[\"'](sqlite|postgres)[\"']|"
    r"[\"'](sqlite|postgres)[\"']\s*(==|!=|in)"
)


def test_nothing_outside_storage_asks_which_dialect_it_is() -> None:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        # The effects helper works on the user's own connection (asyncpg or aiosqlite), not the store's.
        if relative.parts[0] in ("storage", "_proto") or relative == Path("worker/effects.py"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _DIALECT_CHECK.search(line):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert found == []


def test_the_dialect_check_finder_finds_one() -> None:
    assert _DIALECT_CHECK.search('prompt_results=store.dialect != "sqlite"')
    assert _DIALECT_CHECK.search("faults = store if isinstance(store, SQLiteStore) else None")
    assert not _DIALECT_CHECK.search("prompt_results=store.capabilities.prompt_results")
