"""The layout stays the way docs/internals/code-map.md describes it.

Read from the source, not from what happens to be imported: every ``import`` inside ``fastlane``
(at module level, inside functions and under ``TYPE_CHECKING`` alike) is an edge, and the graph
of modules must have no cycle; no module may grow past 500 lines; the wheel's package list names
every package directory, and only packages under ``fastlane``.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 500
GENERATED = "fastlane._proto"
# Where each package's code lives: fastlane/ itself, and the benchmark harness, which stays at the
# top of the repository and ships as fastlane.bench.
SOURCE_ROOTS = {"fastlane": ROOT / "fastlane", "fastlane.bench": ROOT / "bench"}


def modules() -> dict[str, Path]:
    """Every module name under ``fastlane`` (packages by their ``__init__``), with its file."""
    found: dict[str, Path] = {}
    for prefix, root in SOURCE_ROOTS.items():
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join((prefix, *parts))
            if name.startswith("fastlane.bench") and prefix == "fastlane":
                continue  # not a real path under fastlane/, only a mapping
            found[name] = path
    return found


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The fastlane modules ``name`` imports: ``from a import b`` names module a.b when b is one."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in known else base)
    return {t for t in targets if t in known and t != name}


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imported_modules(name, path, known) for name, path in found.items() if not name.startswith(GENERATED)}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep graph cannot hit the recursion limit.
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def test_no_import_cycle_inside_fastlane() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    # The check above must be able to fail: a -> b -> c -> a is reported, d stays out of it.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == [["a", "b", "c"]]


def test_edges_are_read_from_every_kind_of_import() -> None:
    graph = import_graph()
    # A function-level import (open_store picks its backend lazily) is an edge too.
    assert "fastlane.storage.sqlite" in graph["fastlane.storage"]
    # ``from package import submodule`` points at the submodule, not the package.
    assert "fastlane.rpc.wire" in graph["fastlane.client.client"]


def test_no_module_over_500_lines() -> None:
    long = {
        name: n
        for name, path in modules().items()
        if not name.startswith(GENERATED) and (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


@pytest.fixture(scope="module")
def setuptools_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_the_wheel_ships_every_package_and_only_fastlane(setuptools_config: dict) -> None:
    listed = set(setuptools_config["packages"])
    package_dirs = {name for name, path in modules().items() if path.name == "__init__.py"}
    # A directory of data files only (templates, migrations) is listed as a package too, with its
    # files in package-data: setuptools warns about one that is not.
    data_dirs = {
        ".".join(path.relative_to(ROOT).parts)
        for path in (ROOT / "fastlane").rglob("*")
        if path.is_dir() and path.name != "__pycache__" and not (path / "__init__.py").exists()
        and any(child.is_file() for child in path.iterdir())
    }
    assert listed == package_dirs | data_dirs
    assert set(setuptools_config["package-data"]) - {"fastlane"} == data_dirs
    assert all(name == "fastlane" or name.startswith("fastlane.") for name in listed)
    for package, directory in setuptools_config["package-dir"].items():
        assert (ROOT / directory / "__init__.py").exists(), package


def test_test_modules_have_unique_basenames() -> None:
    # pytest imports test modules by basename (rootdir-relative, no packages): two with one name
    # stop the whole collection.
    names = [path.name for path in (ROOT / "tests").rglob("test_*.py")]
    assert sorted({name for name in names if names.count(name) > 1}) == []


# -- the top level holds the public API and packages, nothing else --------------------------------

TOP_LEVEL_FILES = {"__init__.py", "__main__.py", "errors.py", "py.typed"}


def test_the_top_level_holds_only_the_public_api_and_packages() -> None:
    top = ROOT / "fastlane"
    files = {path.name for path in top.iterdir() if path.is_file()}
    packages = {path.name for path in top.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert files == TOP_LEVEL_FILES
    assert [name for name in sorted(packages) if not (top / name / "__init__.py").exists()] == []


# -- no class assembled from mixins ----------------------------------------------------------------


def project_classes() -> dict[str, tuple[str, ast.ClassDef]]:
    """Every class defined in ``fastlane`` by name (with its module), generated code aside."""
    found: dict[str, tuple[str, ast.ClassDef]] = {}
    for name, path in modules().items():
        if name.startswith(GENERATED):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found[node.name] = (name, node)
    return found


def base_names(node: ast.ClassDef) -> list[str]:
    return [base.id if isinstance(base, ast.Name) else base.attr for base in node.bases
            if isinstance(base, ast.Name | ast.Attribute)]


def is_interface(name: str, classes: dict[str, tuple[str, ast.ClassDef]]) -> bool:
    """A Protocol, or an exception: bases that carry a contract or a kind, not code to share."""
    seen: set[str] = set()
    pending = [name]
    while pending:
        current = pending.pop()
        if current in ("Protocol", "Exception", "BaseException") or current.endswith("Error"):
            return True
        if current in classes and current not in seen:
            seen.add(current)
            pending.extend(base_names(classes[current][1]))
    return False


def stubs_for_siblings(node: ast.ClassDef) -> list[str]:
    """Methods whose whole body raises NotImplementedError: a mixin reaching for what the class it
    is mixed into provides."""
    found = []
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            body = [statement for statement in item.body if not isinstance(statement, ast.Expr)]
            if len(body) == 1 and isinstance(body[0], ast.Raise) and "NotImplementedError" in ast.unparse(body[0]):
                found.append(item.name)
    return found


def mixin_assemblies(classes: dict[str, tuple[str, ast.ClassDef]]) -> list[str]:
    problems = []
    for name, (module, node) in sorted(classes.items()):
        code_bases = [base for base in base_names(node) if base in classes and not is_interface(base, classes)]
        if len(code_bases) > 1:
            problems.append(f"{module}.{name} is assembled from {code_bases}")
        for base in code_bases:
            if stubs := stubs_for_siblings(classes[base][1]):
                problems.append(f"{module}.{name} mixes in {base}, which stubs {stubs} for it")
    return problems


def test_no_class_is_assembled_from_mixins() -> None:
    # A class split into mixins only to keep each file short hides which part owns which state;
    # a large concept is composed of parts instead (the store of its jobs, lane, runs ... parts).
    assert mixin_assemblies(project_classes()) == []


def test_the_mixin_finder_finds_one() -> None:
    source = '''
class Calls:
    def _connect(self):
        raise NotImplementedError
class More:
    def more(self): return 1
class Client(Calls, More):
    pass
class Refusal(ValueError):
    pass
class Kind(Refusal, More):
    pass
'''
    classes = {node.name: ("m", node) for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)}
    assert mixin_assemblies(classes) == [
        "m.Client is assembled from ['Calls', 'More']",
        "m.Client mixes in Calls, which stubs ['_connect'] for it",
    ]
