"""The test kit as a user meets it: a real Worker's handlers run through fastlane.testing.FakeNode."""

from __future__ import annotations

import asyncio
import re
import sys
import types
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fastlane import AttemptOutcome, ConfigurationError, PermanentError, RetryableError, RunContext, Worker
from fastlane.testing import FakeNode, RunResult, until


def worker_with_handlers() -> tuple[Worker, asyncio.Event]:
    """A worker with one handler of each kind; the event releases the "slow" one."""
    worker = Worker(drain_timeout=1.0)
    release = asyncio.Event()

    @worker.handler("report.build")
    async def build(ctx: RunContext) -> dict[str, object]:
        day = ctx.json()["day"]
        return {"day": day, "attempt": ctx.attempt, "tenant": ctx.tenant, "key": ctx.idempotency_key}

    @worker.handler("flaky")
    async def flaky(ctx: RunContext) -> None:
        raise RetryableError("the mail server said 421")

    @worker.handler("doomed")
    async def doomed(ctx: RunContext) -> None:
        raise PermanentError("no such customer")

    @worker.handler("resumable")
    async def resumable(ctx: RunContext) -> str:
        done = int(ctx.checkpoint or b"0")
        ctx.save_checkpoint(str(done + 5).encode())
        ctx.report_progress(0.5)
        await ctx.heartbeat()
        await release.wait()
        return f"resumed from {done}"

    @worker.handler("slow")
    async def slow(ctx: RunContext) -> None:
        await release.wait()

    return worker, release


async def test_a_handler_that_returns_succeeds_with_its_output():
    worker, _ = worker_with_handlers()
    async with FakeNode() as node, node.serving(worker):
        result = await node.run("report.build", {"day": "2030-01-01"}, run_id="r1", attempt=2)

    assert isinstance(result, RunResult)
    assert result.succeeded and not result.retryable
    assert (result.run_id, result.attempt, result.outcome) == ("r1", 2, AttemptOutcome.SUCCEEDED)
    assert result.output == {"day": "2030-01-01", "attempt": 2, "tenant": "acme", "key": "key-r1"}
    assert (result.error_type, result.error_message, result.traceback) == ("", "", "")
    assert result.started_at is not None and result.finished_at is not None
    assert result.started_at <= result.finished_at and result.started_at.tzinfo is UTC


async def test_a_checkpoint_saved_just_before_the_handler_fails_reaches_the_node_with_its_result():
    """No heartbeat between the checkpoint and the failure: the last one goes just before the
    result, so the retry resumes from what the handler saved."""
    worker = Worker(drain_timeout=1.0)

    @worker.handler("import")
    async def import_rows(ctx: RunContext) -> None:
        ctx.save_checkpoint(b"row 4000")
        ctx.report_progress(0.4)
        raise RetryableError("the source closed the connection")

    async with FakeNode(heartbeat_interval=timedelta(hours=1)) as node, node.serving(worker):  # no periodic beat
        result = await node.run("import", {})

    assert result.outcome is AttemptOutcome.FAILED
    assert result.checkpoint == b"row 4000" and result.progress == pytest.approx(0.4)  # a float32 on the wire


async def test_retryable_and_permanent_errors_come_back_as_their_outcomes():
    worker, _ = worker_with_handlers()
    async with FakeNode() as node, node.serving(worker):
        flaky, doomed = node.assign("flaky"), node.assign("doomed")
        retried, failed = await flaky.result(), await doomed.result()

    assert (retried.outcome, retried.retryable) == (AttemptOutcome.FAILED, True)
    assert (retried.error_type, retried.error_message) == ("RetryableError", "the mail server said 421")
    assert "raise RetryableError" in retried.traceback
    assert (failed.outcome, failed.retryable) == (AttemptOutcome.PERMANENT_FAILURE, False)
    assert (failed.error_type, failed.error_message) == ("PermanentError", "no such customer")
    assert not failed.succeeded and failed.output is None


async def test_a_job_type_without_a_handler_fails_the_attempt():
    worker, _ = worker_with_handlers()
    async with FakeNode() as node, node.serving(worker):
        result = await node.run("nobody.handles.this")

    assert (result.outcome, result.error_type) == (AttemptOutcome.FAILED, "UnknownJobType")


async def test_checkpoints_reach_the_node_and_a_later_attempt_resumes_from_one():
    worker, release = worker_with_handlers()
    async with FakeNode() as node, node.serving(worker):
        first = node.assign("resumable", run_id="r1")
        saved = await first.checkpoint_saved()
        assert (saved, first.checkpoints, first.progress) == (b"5", [b"5"], 0.5)
        release.set()
        done = await first.result()
        again = await node.run("resumable", run_id="r1", attempt=2, checkpoint=saved)

    assert (done.output, done.checkpoint, done.progress) == ("resumed from 0", b"5", 0.5)
    assert (again.output, again.checkpoint, again.attempt) == ("resumed from 5", b"10", 2)


async def test_a_cancelled_run_ends_cancelled_with_the_reason():
    worker, _ = worker_with_handlers()
    async with FakeNode() as node, node.serving(worker):
        handle = node.assign("slow")
        await handle.started()
        handle.cancel("the job was deleted")
        result = await handle.result()

    assert (result.outcome, result.error_message) == (AttemptOutcome.CANCELLED, "the job was deleted")
    assert not result.retryable


async def test_a_handler_past_its_timeout_is_timed_out():
    worker, _ = worker_with_handlers()
    async with FakeNode() as node, node.serving(worker):
        result = await node.run("slow", handler_timeout=timedelta(milliseconds=50))

    assert (result.outcome, result.retryable) == (AttemptOutcome.TIMED_OUT, True)


async def test_waiting_for_a_result_that_never_comes_times_out_naming_the_run():
    worker, release = worker_with_handlers()
    async with FakeNode(timeout=0.2) as node, node.serving(worker):
        handle = node.assign("slow", run_id="stuck")
        with pytest.raises(TimeoutError, match="the result of run stuck"):
            await handle.result()
        release.set()
        assert (await handle.result(timeout=5)).succeeded


async def test_serving_stops_the_worker_in_bounded_time_even_while_a_handler_hangs():
    worker = Worker(drain_timeout=30.0)
    entered = asyncio.Event()

    @worker.handler("hang")
    async def hang(ctx: RunContext) -> None:
        entered.set()
        await asyncio.Event().wait()

    started = asyncio.get_running_loop().time()
    async with FakeNode(timeout=0.5) as node:
        async with node.serving(worker):
            node.assign("hang")
            await asyncio.wait_for(entered.wait(), 5)
        with pytest.raises(RuntimeError, match="not started|once"):
            await worker.run()  # run() is once per Worker
    assert asyncio.get_running_loop().time() - started < 5
    assert not worker.connected


async def test_a_worker_that_cannot_start_says_why():
    async with FakeNode() as node:
        with pytest.raises(ConfigurationError, match="no handlers"):
            async with node.serving(Worker()):
                pass  # pragma: no cover - serving raises first


async def test_assigning_needs_a_connected_worker():
    async with FakeNode() as node:
        with pytest.raises(RuntimeError, match="no worker is connected"):
            node.assign("report.build")
    with pytest.raises(RuntimeError, match="not started"):
        _ = FakeNode().address


async def test_until_returns_the_first_truthy_value_of_a_sync_or_async_condition():
    calls: list[int] = []

    def sync() -> list[int] | None:
        calls.append(1)
        return calls if len(calls) >= 3 else None

    async def asynchronous() -> str:
        return "ready"

    assert await until(sync, 5, "three calls", interval=0.001) == [1, 1, 1]
    assert await until(asynchronous, 5) == "ready"


async def test_until_times_out_naming_what_it_waited_for():
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError, match=r"timed out after 0.1 s waiting for the moon \(last: 0\)"):
        await until(lambda: 0, 0.1, "the moon")
    assert 0.1 <= loop.time() - started < 2


async def test_run_times_come_from_the_worker_clock():
    worker, _ = worker_with_handlers()
    before = datetime.now(UTC)
    async with FakeNode() as node, node.serving(worker):
        result = await node.run("report.build", {"day": "d"})
    assert result.started_at is not None and before - timedelta(seconds=1) <= result.started_at <= datetime.now(UTC)


# -- the README's example ----------------------------------------------------------------------

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example() -> str:
    """The code block of the README's "Testing a handler" section, as written there."""
    section = README.read_text().split("### Testing a handler\n", 1)[1].split("\n### ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


async def test_the_readme_example_runs_and_passes():
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(readme_example(), str(README), "exec"), namespace)
    tests = [name for name in namespace if name.startswith("test_")]
    assert tests == ["test_bill_invoices_the_region_and_refuses_an_unknown_one"]
    await namespace[tests[0]]()  # type: ignore[operator]


async def test_the_docs_example_runs_and_passes():
    docs = README.parent / "docs" / "testing.md"
    block = docs.read_text().split("## Testing a handler\n", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {"__name__": "docs_example"}
    exec(compile(block, str(docs), "exec"), namespace)
    await namespace["test_report_build"]()  # type: ignore[operator]


async def test_the_tutorials_handler_and_its_test_run_as_written(monkeypatch: pytest.MonkeyPatch):
    """The tutorial's tasks.py (its first two blocks) and its test_tasks.py, as a reader pastes them."""
    tutorial = README.parent / "docs" / "tutorial.md"
    blocks = re.findall(r"```python\n(.*?)```", tutorial.read_text(), re.S)
    tasks_source = blocks[0] + blocks[1]
    test_source = next(block for block in blocks if "from tasks import worker" in block)
    tasks = types.ModuleType("tasks")
    exec(compile(tasks_source, f"{tutorial}:tasks.py", "exec"), tasks.__dict__)
    monkeypatch.setitem(sys.modules, "tasks", tasks)
    namespace: dict[str, object] = {"__name__": "test_tasks"}
    exec(compile(test_source, f"{tutorial}:test_tasks.py", "exec"), namespace)
    tests = [name for name in namespace if name.startswith("test_")]
    assert tests == ["test_greet_returns_whom_it_greeted"]
    await namespace[tests[0]]()  # type: ignore[operator]
    assert set(tasks.worker.job_types) == {"greet", "flaky"}
