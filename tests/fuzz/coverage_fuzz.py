"""Run one target of ``coverage_targets.py`` under atheris, a coverage-guided fuzzer, for a bounded time.

    python tests/fuzz/coverage_fuzz.py TARGET --seconds 60

fastlane's modules are instrumented as they are imported, so the fuzzer keeps the inputs that
reach new branches of fastlane's own code and mutates those. It starts from the target's seeds
(drawn from the hypothesis suites' strategies) in a scratch corpus. An input that crashes the
target (an exception that is not an answer, or one input running longer than ``--timeout``) is
written to ``crashes/TARGET/`` and the run exits non-zero: fix the cause and commit the file,
which ``test_coverage_fuzz.py`` then replays in every run of the suite.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
from pathlib import Path

import atheris

HERE = Path(__file__).resolve().parent
# What the targets call into: imported under instrumentation, before anything imports them plainly.
INSTRUMENTED = (
    "fastlane.errors", "fastlane.domain.models", "fastlane.domain.validation", "fastlane.domain.schedules",
    "fastlane.domain.workflow_definitions", "fastlane.rpc.wire", "fastlane.server.servicers.workers",
    "fastlane.console.forms", "fastlane.storage.codec",
)
SEEDS = 200


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="which parser to fuzz (see coverage_targets.TARGETS)")
    parser.add_argument("--seconds", type=int, default=60, help="how long to fuzz (default: 60)")
    parser.add_argument("--timeout", type=int, default=10,
                        help="seconds one input may take before it counts as a crash (default: 10)")
    parser.add_argument("--corpus", type=Path, default=None,
                        help="the directory the inputs found go to (default: a new temporary one); the fuzzer "
                             "ends the process, so no temporary directory of its own would be removed")
    args = parser.parse_args()
    with atheris.instrument_imports(include=["fastlane"]):
        for module in INSTRUMENTED:
            importlib.import_module(module)
    sys.path.insert(0, str(HERE))
    import coverage_targets

    target = coverage_targets.TARGETS.get(args.target)
    if target is None:
        parser.error(f"no target {args.target!r}: one of {', '.join(coverage_targets.TARGETS)}")
    crashes = coverage_targets.CRASHES / target.name
    crashes.mkdir(parents=True, exist_ok=True)
    corpus = args.corpus or Path(tempfile.mkdtemp(prefix=f"fuzz-{target.name}-"))
    corpus.mkdir(parents=True, exist_ok=True)
    for index, seed in enumerate(target.seeds(SEEDS)):
        (corpus / f"seed-{index}").write_bytes(seed)
    for index, kept in enumerate(coverage_targets.kept_crashes(target.name)):
        (corpus / f"kept-{index}").write_bytes(kept.read_bytes())
    atheris.Setup([sys.argv[0], str(corpus), f"-max_total_time={args.seconds}", f"-timeout={args.timeout}",
                   f"-artifact_prefix={crashes}/", "-rss_limit_mb=2048", "-print_final_stats=1"], target.check)
    atheris.Fuzz()  # ends the process: 0 when the time ran out with no crash
    return 0


if __name__ == "__main__":
    sys.exit(main())
