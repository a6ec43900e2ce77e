"""The console's bulk actions: cancel or retry every run the runs page's filter shows; pause,
resume or delete every job the jobs page's filter shows.

The filter's buttons post it to ``/runs/bulk/{action}`` (or ``/jobs/bulk/{action}``), which counts
first (a dry run of ``ActOnRuns`` or ``ActOnJobs``) and shows a page to confirm that many; the
confirmation posts again with ``confirm``, and the items are acted on call after call (each call
a bounded number, each item in its own transaction and audited, as the CLI does), at most
:data:`MOST_PER_CLICK` per click so that a request ends in seconds. The answer is a redirect to
the list page with the counts (numbers only: no text from the URL is shown).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from aiohttp import web
from google.protobuf.message import Message
from yarl import URL

from fastlane._proto import jobs_pb2, runs_pb2
from fastlane.console.gateway import CallRefused
from fastlane.console.rendering import call_api, job_id_named, render, see_other
from fastlane.domain.records import JobAction, RunAction
from fastlane.errors import InvalidArgument
from fastlane.rpc.enums import JOB_ACTION, JOB_STATE, RUN_ACTION, RUN_STATE

MOST_PER_CLICK = 10_000
PER_CALL = 1_000


@dataclass(frozen=True, slots=True)
class _Verb:
    items: str  # "runs", the list page's path without its slash
    done: str  # "cancelled"


# Every bulk action by its name (the names are distinct across runs and jobs).
VERBS: Mapping[str, _Verb] = {
    RunAction.CANCEL.value: _Verb("runs", "cancelled"), RunAction.RETRY.value: _Verb("runs", "scheduled again"),
    JobAction.PAUSE.value: _Verb("jobs", "paused"), JobAction.RESUME.value: _Verb("jobs", "resumed"),
    JobAction.DELETE.value: _Verb("jobs", "deleted"),
}


def add_routes(app: web.Application) -> None:
    app.router.add_post("/runs/bulk/{action}", act_on_runs)  # before /runs/{run_id}/{action}
    app.router.add_post("/jobs/bulk/{action}", act_on_jobs)  # before /jobs/{job_id}/{action}


def bulk_note(query: Mapping[str, str]) -> str | None:
    """The note of a finished bulk action, from the counts in the redirect's query."""
    get = query.get
    done = get("done", "")
    verb = VERBS.get(done.removeprefix("bulk-")) if done.startswith("bulk-") else None
    if verb is None:
        return None
    acted, skipped = _count(get("acted", "")), _count(get("skipped", ""))
    note = f"{acted:,} {verb.items} {verb.done}"
    note += f" ({skipped:,} skipped: they had changed meanwhile)" if skipped else ""
    if get("more", "") == "1":
        note += f"; more {verb.items} are left: act again to go on"
    if get("stopped", "") == "1":
        note += "; stopped by the tenant's max_waiting_runs quota: try again once workers have caught up"
    return note + "."


def _count(text: str) -> int:
    return int(text) if text.isdigit() and len(text) <= 9 else 0


async def act_on_runs(request: web.Request) -> web.StreamResponse:
    action = RunAction(_action_of(request, "runs"))
    form = await request.post()
    back = {key: str(form.get(key, "")).strip() for key in ("state", "job", "type")}
    selection = runs_pb2.RunSelection(job_id=await job_id_named(request, back["job"]), job_type=back["type"],
                                      states=_states(RUN_STATE, back["state"]))
    ask = runs_pb2.ActOnRunsRequest(action=RUN_ACTION.number(action), selection=selection)
    return await _count_or_act(request, form, ask, "RunService/ActOnRuns", runs_pb2.ActOnRunsResponse, back)


async def act_on_jobs(request: web.Request) -> web.StreamResponse:
    action = JobAction(_action_of(request, "jobs"))
    form = await request.post()
    back = {key: str(form.get(key, "")).strip() for key in ("state", "type")}
    selection = jobs_pb2.JobSelection(job_type=back["type"], states=_states(JOB_STATE, back["state"]))
    ask = jobs_pb2.ActOnJobsRequest(action=JOB_ACTION.number(action), selection=selection)
    return await _count_or_act(request, form, ask, "JobService/ActOnJobs", jobs_pb2.ActOnJobsResponse, back)


def _action_of(request: web.Request, items: str) -> str:
    word = request.match_info["action"]
    verb = VERBS.get(word)
    if verb is None or verb.items != items:
        raise web.HTTPNotFound(text=f"no bulk action {word!r} on {items}")
    return word


def _states(values: Any, state: str) -> list[Any]:  # the wire numbers of RunState or JobState
    try:
        return [values.named(state, "state")] if state else []
    except InvalidArgument as refused:
        raise CallRefused(grpc.StatusCode.INVALID_ARGUMENT, str(refused)) from None


async def _count_or_act(request: web.Request, form: Mapping[str, Any], ask: Any, rpc: str, reply: type[Message],
                        back: dict[str, str]) -> web.StreamResponse:
    """A dry run shown to confirm; or, confirmed, calls until the selection is done or the click's share is."""
    action = request.match_info["action"]
    verb = VERBS[action]
    if form.get("confirm") != "1":
        counted = await _call(request, ask, rpc, reply, dry_run=True)
        return render(request, "bulk.html", action=action, items=verb.items, done=verb.done, count=counted.matched,
                      filters=back, back=str(URL.build(path=f"/{verb.items}", query=back)))
    acted = skipped = 0
    token, stopped = "", False
    while acted + skipped < MOST_PER_CLICK:
        ask.page_token = token
        outcome = await _call(request, ask, rpc, reply, dry_run=False)
        acted, skipped, token = acted + outcome.acted, skipped + outcome.skipped, outcome.next_page_token
        stopped = bool(getattr(outcome, "stopped_because", ""))
        if not token or stopped:
            break
    query = URL.build(path=f"/{verb.items}", query={**back, "done": f"bulk-{action}", "acted": str(acted),
                                                     "skipped": str(skipped), "more": "1" if token else "0",
                                                     "stopped": "1" if stopped else "0"})
    return see_other(str(query))


async def _call(request: web.Request, ask: Any, rpc: str, reply: type[Message], *, dry_run: bool) -> Any:
    ask.dry_run, ask.limit = dry_run, PER_CALL
    return await call_api(request, rpc, ask, reply)
