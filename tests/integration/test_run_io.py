"""A run's input and output, through a real node requiring tokens and a real worker, on both
backends: what a handler returned is kept with the run and shown with its payload by GetRun, the
SDK, ``runs get`` and the console, and a workflow's step outputs by GetWorkflowRun, ``workflows
show`` and the console, to every role that may read payloads (not a viewer), and to nobody on a
node started with ``--hide-payloads``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import aiohttp
import orjson
import pytest
from secured_nodes import SecuredNode, secured_node

from fastlane.cli.main import main
from fastlane.domain.models import Run, RunState, Schedule
from fastlane.worker import RunContext, Worker

WAIT = 20.0
HOURLY = Schedule.interval(timedelta(hours=1))


@pytest.fixture(params=[False, True], ids=["shown", "hidden"])
async def node(request: pytest.FixtureRequest, db_url: str) -> AsyncIterator[SecuredNode]:
    async with secured_node(db_url, hide_payloads=request.param, console_listen="127.0.0.1:0") as secured:
        yield secured


async def finished_run(node: SecuredNode, returned: object) -> Run:
    """A run of tenant a whose handler, on a real worker, returned ``returned``."""
    worker = Worker(node.address, worker_id="io", concurrency=2, follow_cluster=False, token=node.secrets["worker-a"])

    @worker.handler("ledger.close")
    async def close(ctx: RunContext) -> object:
        return returned

    task = asyncio.create_task(worker.run())
    try:
        async with node.client("client-a") as client:
            job = await client.create("close", "ledger.close", HOURLY, payload={"ledger": "EU-7"})
            run = await client.trigger_job(job.job_id)
            async with asyncio.timeout(WAIT):
                while (await client.get_run(run.run_id))[0].state is not RunState.SUCCEEDED:
                    await asyncio.sleep(0.05)
        return run
    finally:
        await asyncio.wait_for(worker.stop(), WAIT)
        await asyncio.wait_for(task, WAIT)


async def test_a_runs_input_and_output_are_shown_to_the_roles_that_may_read_payloads(
        node: SecuredNode, capsys: pytest.CaptureFixture[str]) -> None:
    hidden = node.node.settings.hide_payloads
    run = await finished_run(node, {"closed": 3, "currency": "EUR"})
    async with node.client("client-a") as client, node.client("viewer-a") as viewer:
        seen, _ = await client.get_run(run.run_id)
        if hidden:
            assert (seen.payload, seen.output) == (b"", None)
        else:
            assert orjson.loads(seen.payload) == {"ledger": "EU-7"}
            assert orjson.loads(seen.output or b"") == {"closed": 3, "currency": "EUR"}
        by_viewer, _ = await viewer.get_run(run.run_id)  # a viewer: metadata only
        assert (by_viewer.payload, by_viewer.output, by_viewer.state) == (b"", None, RunState.SUCCEEDED)
        assert (await viewer.get_job(run.job_id)).spec.payload == b""
        assert (await client.get_job(run.job_id)).spec.payload == (b"" if hidden else b'{"ledger":"EU-7"}')

    # runs get, as JSON and as text.
    code, out, err = await run_cli(capsys, node, "client-a", "runs", "get", run.run_id, "--json")
    assert code == 0, err
    shown = orjson.loads(out)
    assert (shown["payload"], shown["output"]) == ((None, None) if hidden else
                                                    ({"ledger": "EU-7"}, {"closed": 3, "currency": "EUR"}))
    code, out, _ = await run_cli(capsys, node, "client-a", "runs", "get", run.run_id)
    output_line = next(line for line in out.splitlines() if line.startswith("output"))
    assert output_line.split(None, 1)[1] == ("-" if hidden else '{"closed":3,"currency":"EUR"}')

    # The console's run page: the same rule; and its start lag, from its first attempt's start.
    page = await console_page(node, "client-a", f"/runs/{run.run_id}")
    assert page.split("<dt>start lag</dt><dd>")[1].split("</dd>")[0] not in {"—", ""}
    if hidden:
        assert 'id="run-io-hidden"' in page and "EU-7" not in page.split("<main>", 1)[1]
    else:
        assert "EU-7" in page.split('id="run-input"')[1].split("</pre>")[0]
        assert "&#34;currency&#34;: &#34;EUR&#34;" in page.split('id="run-output"')[1].split("</pre>")[0]
    viewer_page = await console_page(node, "viewer-a", f"/runs/{run.run_id}")
    # The page's content only: the header's random CSRF token may hold any three letters.
    shown = viewer_page.split("<main>", 1)[1]
    assert 'id="run-io-hidden"' in shown and "EU-7" not in shown and "EUR" not in shown


async def test_an_output_that_is_not_json_is_dropped_and_the_run_still_succeeds(node: SecuredNode) -> None:
    run = await finished_run(node, {"when": object()})  # orjson cannot encode it: the SDK drops it
    async with node.client("client-a") as client:
        seen, _ = await client.get_run(run.run_id)
    assert (seen.state, seen.output) == (RunState.SUCCEEDED, None)


async def run_cli(capsys: pytest.CaptureFixture[str], node: SecuredNode, who: str, *argv: str) -> tuple[int, str, str]:
    # main() runs its own event loop, so it runs in a thread while this loop serves the node.
    env_token = {"FASTLANE_TOKEN": node.secrets[who]}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env_token.items():
            patch.setenv(name, value)
        code = await asyncio.to_thread(main, [*argv, "--server", node.address])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def console_page(node: SecuredNode, who: str, path: str) -> str:
    """``path`` of the node's console, signed in with ``who``'s token."""
    base = (node.node.console_url or "").rstrip("/")
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True),
                                     timeout=aiohttp.ClientTimeout(total=20)) as browser:
        async with browser.post(base + "/signin", data={"token": node.secrets[who]}, allow_redirects=False) as answer:
            assert answer.status == 303, await answer.text()
        async with browser.get(base + path) as answer:
            assert answer.status == 200
            return await answer.text()


async def test_a_workflow_steps_outputs_are_shown_by_the_same_rule(node: SecuredNode,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    hidden = node.node.settings.hide_payloads
    worker = Worker(node.address, worker_id="steps", concurrency=2, follow_cluster=False,
                    token=node.secrets["worker-a"])

    @worker.handler("ledger.sum")
    async def total(ctx: RunContext) -> object:
        return {"total": 42}

    @worker.handler("ledger.mail")
    async def mail(ctx: RunContext) -> None:
        return None

    definition = {"name": "close", "steps": [{"name": "sum", "job_type": "ledger.sum"},
                                             {"name": "mail", "job_type": "ledger.mail", "after": ["sum"]}]}
    task = asyncio.create_task(worker.run())
    try:
        async with node.client("client-a") as client, node.client("viewer-a") as viewer:
            await client.create_workflow(definition)
            started = await client.trigger_workflow("close")
            async with asyncio.timeout(WAIT):
                while (await client.get_workflow_run(started.workflow_run_id))[0].state.value != "succeeded":
                    await asyncio.sleep(0.05)
            _, _, steps = await client.get_workflow_run(started.workflow_run_id)
            outputs = {step.name: step.outputs for step in steps}
            assert outputs == ({"sum": (), "mail": ()} if hidden else {"sum": (b'{"total":42}',), "mail": (None,)})
            _, _, seen_by_viewer = await viewer.get_workflow_run(started.workflow_run_id)
            assert {step.name: step.outputs for step in seen_by_viewer} == {"sum": (), "mail": ()}
    finally:
        await asyncio.wait_for(worker.stop(), WAIT)
        await asyncio.wait_for(task, WAIT)
    code, out, err = await run_cli(capsys, node, "client-a", "workflows", "show", started.workflow_run_id)
    assert code == 0, err
    assert ('→ {"total":42}' in out) is not hidden
    page = await console_page(node, "client-a", f"/workflow-runs/{started.workflow_run_id}")
    assert ("&#34;total&#34;: 42" in page) is not hidden
    assert '<td class="error-text">None</td>' not in page  # a step without an error shows none
    graph = page.split('id="dag"')[1].split("</svg>")[0]  # the graph, each step coloured by its state
    assert '<g class="step succeeded" data-step="sum">' in graph and '<g class="step succeeded" data-step="mail">' in graph
    assert graph.count("<line ") == 1
    drawn = page.split('id="timeline"')[1]  # both steps ran: both on the timeline, sum first
    assert drawn.index('<span class="timeline-step">sum</span>') < drawn.index('<span class="timeline-step">mail</span>')
