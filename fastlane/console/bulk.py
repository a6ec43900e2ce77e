"""The console's bulk actions: cancel or retry every run the runs page's filter shows.

The filter's buttons post it to ``/runs/bulk/{action}``, which counts first (a dry run of
``ActOnRuns``) and shows a page to confirm that many; the confirmation posts again with
``confirm``, and the runs are acted on call after call (each call a bounded number of runs, each
run in its own transaction and audited, as the CLI does), at most :data:`MOST_PER_CLICK` per
click so that a request ends in seconds. The answer is a redirect to the runs page with the counts
(numbers only: no text from the URL is shown).
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc
from aiohttp import web
from yarl import URL

from fastlane._proto import runs_pb2
from fastlane.console.gateway import CallRefused
from fastlane.console.rendering import call_api, render, see_other
from fastlane.domain.records import RunAction
from fastlane.errors import InvalidArgument
from fastlane.rpc.enums import RUN_ACTION, RUN_STATE

MOST_PER_CLICK = 10_000
PER_CALL = 1_000
DONE = {RunAction.CANCEL: "cancelled", RunAction.RETRY: "scheduled again"}


def add_routes(app: web.Application) -> None:
    app.router.add_post("/runs/bulk/{action}", act_on_runs)  # before /runs/{run_id}/{action}


def bulk_note(query: Mapping[str, str]) -> str | None:
    """The note of a finished bulk action, from the counts in the redirect's query."""
    get = query.get
    action = {"bulk-cancel": RunAction.CANCEL, "bulk-retry": RunAction.RETRY}.get(get("done", ""))
    if action is None:
        return None
    acted, skipped = _count(get("acted", "")), _count(get("skipped", ""))
    note = f"{acted:,} runs {DONE[action]}" + (f" ({skipped:,} skipped: they had changed meanwhile)" if skipped else "")
    if get("more", "") == "1":
        note += "; more runs are left: act again to go on"
    if get("stopped", "") == "1":
        note += "; stopped by the tenant's max_waiting_runs quota: try again once workers have caught up"
    return note + "."


def _count(text: str) -> int:
    return int(text) if text.isdigit() and len(text) <= 9 else 0


async def act_on_runs(request: web.Request) -> web.StreamResponse:
    word = request.match_info["action"]
    try:
        action = RunAction(word)
    except ValueError:
        raise web.HTTPNotFound(text=f"no bulk action {word!r}") from None
    form = await request.post()
    state, job_id, job_type = (str(form.get(key, "")).strip() for key in ("state", "job", "type"))
    try:
        states = [RUN_STATE.named(state, "state")] if state else []
    except InvalidArgument as refused:
        raise CallRefused(grpc.StatusCode.INVALID_ARGUMENT, str(refused)) from None
    selection = runs_pb2.RunSelection(job_id=job_id, job_type=job_type, states=states)
    ask = runs_pb2.ActOnRunsRequest(action=RUN_ACTION.number(action), selection=selection)
    back = {"state": state, "job": job_id, "type": job_type}
    if form.get("confirm") != "1":
        counted = await _call(request, ask, dry_run=True)
        return render(request, "runs_bulk.html", action=action.value, done=DONE[action], count=counted.matched,
                      filters=back)
    acted = skipped = 0
    token, stopped = "", False
    while acted + skipped < MOST_PER_CLICK:
        ask.page_token = token
        outcome = await _call(request, ask, dry_run=False)
        acted, skipped, token = acted + outcome.acted, skipped + outcome.skipped, outcome.next_page_token
        stopped = bool(outcome.stopped_because)
        if not token or stopped:
            break
    query = URL.build(path="/runs", query={**back, "done": f"bulk-{action.value}", "acted": str(acted),
                                               "skipped": str(skipped), "more": "1" if token else "0",
                                               "stopped": "1" if stopped else "0"})
    return see_other(str(query))


async def _call(request: web.Request, ask: runs_pb2.ActOnRunsRequest, *, dry_run: bool) -> runs_pb2.ActOnRunsResponse:
    ask.dry_run, ask.limit = dry_run, PER_CALL
    answer: runs_pb2.ActOnRunsResponse = await call_api(request, "RunService/ActOnRuns", ask,
                                                         runs_pb2.ActOnRunsResponse)
    return answer
