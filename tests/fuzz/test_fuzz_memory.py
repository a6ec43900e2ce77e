"""The fuzzer's memory learns ids from every answer that carries one, so probes that name an
existing job, run or workflow run reach it instead of always probing "no such" ids."""

from __future__ import annotations

import pytest
from strategies import JOB_ANSWERS, RUN_ANSWERS, WORKFLOW_RUN_ANSWERS, Memory

from fastlane._proto import common_pb2, workflows_pb2


@pytest.mark.parametrize("answer", JOB_ANSWERS, ids=lambda kind: kind.__name__)
def test_an_answer_with_a_job_teaches_its_id(answer: type) -> None:
    memory = Memory()
    memory.learn(answer(job=common_pb2.Job(job_id="j1", spec=common_pb2.JobSpec(tenant="t", name="n"))))
    assert memory.jobs == [("t", "j1", "n")]


@pytest.mark.parametrize("answer", RUN_ANSWERS, ids=lambda kind: kind.__name__)
def test_an_answer_with_a_run_teaches_its_id(answer: type) -> None:
    memory = Memory()
    memory.learn(answer(run=common_pb2.Run(run_id="r1", tenant="t")))
    assert memory.runs == [("t", "r1")]


@pytest.mark.parametrize("answer", WORKFLOW_RUN_ANSWERS, ids=lambda kind: kind.__name__)
def test_an_answer_with_a_workflow_run_teaches_its_id(answer: type) -> None:
    memory = Memory()
    memory.learn(answer(run=workflows_pb2.WorkflowRun(workflow_run_id="w1")))
    memory.learn(answer(run=workflows_pb2.WorkflowRun(workflow_run_id="w1")))  # remembered once
    assert memory.workflow_runs == ["w1"]
