"""The example worker image (examples/worker), checked offline as the node's image is: it builds on
the fastlane image, runs as its unprivileged user, serves the metrics its manifest scrapes, and its
handlers work (run against the test kit's fake node). scripts/build_images.sh builds and runs it
where a container engine exists."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import tomllib
from pathlib import Path

from fastlane.testing import FakeNode

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "worker"
SCRIPT = REPO / "scripts" / "build_images.sh"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs of a Dockerfile, continuation lines joined, comments dropped."""
    found, pending = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        found.append((keyword.upper(), arguments.strip()))
        pending = ""
    return found


def test_the_worker_image_builds_on_the_fastlane_image_as_its_unprivileged_user() -> None:
    steps = instructions(EXAMPLE / "Dockerfile")
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert ("ARG", f"FASTLANE_IMAGE=fastlane:{version}") in steps  # the tag deploy/Dockerfile is built with
    assert [arguments for keyword, arguments in steps if keyword == "FROM"] == ["${FASTLANE_IMAGE}"]
    node_user = [arguments for keyword, arguments in instructions(REPO / "deploy" / "Dockerfile") if keyword == "USER"]
    users = [arguments for keyword, arguments in steps if keyword == "USER"]
    assert users[-1] == node_user[-1] == "10001:10001"  # root only for the install step
    assert json.loads(dict(steps)["ENTRYPOINT"]) == ["fastlane"]
    command = json.loads(dict(steps)["CMD"])
    assert command[:2] == ["worker", "tasks:worker"]
    port = command[command.index("--metrics") + 1].rsplit(":", 1)[1]
    assert ("EXPOSE", port) in steps and port == "9465"  # the port worker.example.yaml names metrics
    copied = [arguments.split()[0] for keyword, arguments in steps if keyword == "COPY"]
    assert all((EXAMPLE / name).is_file() for name in copied)


async def test_the_example_handlers_run() -> None:
    spec = importlib.util.spec_from_file_location("example_worker_tasks", EXAMPLE / "tasks.py")
    assert spec is not None and spec.loader is not None
    tasks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tasks)
    async with FakeNode() as node, node.serving(tasks.worker):
        done = await node.run("reports.build", {"name": "weekly"})
    assert done.succeeded and done.output["report"] == "weekly"


def test_the_image_script_is_valid_bash_and_named_by_the_docs() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)
    assert "scripts/build_images.sh" in (REPO / "deploy" / "README.md").read_text()
    assert "scripts/build_images.sh" in (REPO / "docs" / "how-to" / "kubernetes.md").read_text()
