"""``retention``: what trimming old history costs the fire path.

The spread of ``spread`` (30,000 one-shot jobs due at 1,000 a second) runs twice, each time over
a database that also holds 1,000,000 runs that finished 40 days ago (scaled: ``1,000,000 x
scale``): first with ``--history-retention 0`` (nothing is trimmed), then with the default 30 days,
so the node trims those runs while the spread's runs fire. The target: the p99 start lag with
trimming at most 10 % above the one without, in the same run. The second result also says how
many old runs the node deleted while the spread's runs fell due (from its
``fastlane_history_trimmed_total``), how fast, and how many were left at the end.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta

from fastlane.bench.harness import CREATE_WORST_S, START_ALLOWANCE_S, Bench
from fastlane.bench.scenarios.oneshot import FASTLANE_GRACE_S, SPREAD_JOBS, SPREAD_OVER_S, measure_fastlane
from fastlane.bench.targets import KEEPING_HISTORY, TRIMMING_HISTORY

from fastlane.testing.history import count_old_runs, seed_old_history

OLD_RUNS = 1_000_000
TRIMMED = "fastlane_history_trimmed_total"
OLD_AGE = timedelta(days=40)  # past the default retention of 30 days
SEED_WORST_S_PER_RUN = 0.0002  # a bound for hard deadlines only, well above what seeding takes
SETUP_S = START_ALLOWANCE_S


async def retention(bench: Bench) -> list[dict[str, object]]:
    jobs = bench.scaled(SPREAD_JOBS, minimum=10)
    over = bench.seconds(SPREAD_OVER_S, minimum=1.0)
    offsets = [index * over / jobs for index in range(jobs)]
    old = bench.scaled(OLD_RUNS, minimum=1_000)
    results = []
    for system, days in ((KEEPING_HISTORY, "0"), (TRIMMING_HISTORY, "30")):
        url = await bench.fresh_database(system.replace(" ", "_"))
        bench.progress.phase(f"{system}: seeding {old:,} runs that finished {OLD_AGE.days} days ago")
        seeded_at = time.monotonic()
        await seed_old_history(url, old, OLD_AGE)
        seed_s = time.monotonic() - seeded_at

        async def trimmed(before: Mapping[str, float], after: Mapping[str, float], seconds: float,
                          url: str = url) -> dict[str, object]:
            during = after.get(TRIMMED, 0.0) - before.get(TRIMMED, 0.0)
            left = await count_old_runs(url)
            return {"old_runs": old, "old_runs_left": left, "trimmed_while_due": int(during),
                    "trimmed_per_s_while_due": round(during / seconds, 1) if seconds > 0 else None}

        result = await measure_fastlane(bench, "spread", offsets, url, system=system,
                                        node_args=["--history-retention", days], after=trimmed)
        result["seed_s"] = round(seed_s, 1)
        results.append(result)
    trimming = results[1]
    if not trimming["trimmed_while_due"]:
        bench.note("no old run was trimmed while the spread's runs fell due: the comparison says nothing")
    return results


def budget(bench: Bench) -> float:
    jobs = bench.scaled(SPREAD_JOBS, minimum=10)
    per_run = SETUP_S + bench.scaled(OLD_RUNS, minimum=1_000) * SEED_WORST_S_PER_RUN + jobs * CREATE_WORST_S
    return 2 * (per_run + bench.seconds(SPREAD_OVER_S, minimum=1.0) + FASTLANE_GRACE_S) + 60
