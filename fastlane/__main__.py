"""``python -m fastlane``: the same as the ``fastlane`` command."""

from __future__ import annotations

from fastlane.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
