"""Trigger lag of one-shot jobs spread over time: now ``fastlane bench spread``.

    python -m fastlane.bench.spread [--backend postgres] [--scale 0.01] [--json] [--out DIR]

Kept so the old entry point still works; it takes the flags of ``fastlane bench spread``
(see ``fastlane bench --help`` and docs/benchmarks.md).
"""

from __future__ import annotations

import sys

from fastlane.cli.main import main as fastlane_main


def main() -> int:
    return fastlane_main(["bench", "spread", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
