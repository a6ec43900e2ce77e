"""Seeded random and boundary requests to every unary RPC of a real daemon, on each backend.

Every answer must be OK or a documented status (conftest.ALLOWED_CODES): never UNKNOWN, and
INTERNAL only for a real bug, which fails the test with the request that caused it. Afterwards
the node must still be alive and SERVING, fire a canary run on a real worker on time, and come
back SERVING after a restart on the same database (no crash loop on what the fuzzing stored).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzz_harness import ALLOWED_CODES, FuzzNode, Tally, report
from hypothesis import HealthCheck, Phase, given, settings
from strategies import Memory, Probe, api_probes

pytestmark = [pytest.mark.fuzz, pytest.mark.e2e, pytest.mark.timeout(420)]

# About 6,000 requests: some 40 s per backend on a slow 2-core machine (measured).
API_EXAMPLES = 6_000

FUZZ_SETTINGS = settings(
    derandomize=True,  # the same requests on every run
    database=None,
    deadline=None,
    max_examples=API_EXAMPLES,
    # No shrinking against a live daemon: answers are recorded, and judged once at the end.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def test_every_rpc_answers_bad_input_with_a_documented_status(fuzz_node: FuzzNode, tmp_path: Path) -> None:
    tally = Tally(fuzz_node.backend, "api", ALLOWED_CODES)
    memory = Memory()

    @FUZZ_SETTINGS
    @given(probe=api_probes())
    def send(probe: Probe) -> None:
        if not fuzz_node.alive():
            return  # the daemon died: every further answer would be UNAVAILABLE; judged below
        request = probe.build(memory)
        code, details, response = fuzz_node.answer(probe.service, probe.method, request)
        tally.record(probe.rpc, probe.fields, request, code, details)
        if response is not None:
            memory.learn(response)
            if probe.live and probe.method == "CreateJob":
                memory.live_jobs.append(response.job.job_id)

    send()
    tally.finish()
    tally.notes["live_jobs_created"] = len(memory.live_jobs)
    failures = []
    try:
        if tally.problems:
            failures.append(f"answers outside the documented set:\n{tally.failures()}")
        assert fuzz_node.alive(), f"the daemon died during the fuzzing:\n{fuzz_node.log_tail()}"
        assert fuzz_node.recorder is not None
        received = fuzz_node.recorder.job_ids()
        tally.notes["live_jobs_received"] = sum(job_id in received for job_id in memory.live_jobs)
        fuzz_node.check_survived(tally)
    except AssertionError as error:
        failures.append(str(error))
    finally:
        report(tally, tmp_path, fuzz_node)
    assert not failures, "\n\n".join(failures)
