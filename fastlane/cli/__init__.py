"""The ``fastlane`` command line: daemon, worker, migrations, jobs, runs and cluster commands."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Run the ``fastlane`` command line; see :func:`fastlane.cli.main.main`."""
    from fastlane.cli.main import main as run

    return run(argv)


__all__ = ["main"]
