"""The console's actions: sign-in, and each change to jobs and runs as one API call.

Every action is a POST of a form that carries the session's CSRF token (checked in front, by
:mod:`.guard`), answered by a redirect to the page that shows its effect (post/redirect/get,
so a reload never repeats it). A refused call shows the API's own message.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from aiohttp import web

from fastlane._proto import jobs_pb2, runs_pb2, workflows_pb2
from fastlane.console.forms import KINDS, JobForm
from fastlane.console.gateway import CallRefused
from fastlane.console.guard import set_session_cookie
from fastlane.console.rendering import (
    CONSOLE,
    STATUS_OF_REFUSAL,
    call_api,
    caller_of,
    render,
    see_other,
    session_of,
)
from fastlane.console.sessions import COOKIE
from fastlane.domain.errors import StorageUnavailable, Unauthenticated
from fastlane.errors import InvalidArgument
from fastlane.rpc import wire

log = logging.getLogger("fastlane.console")

JOB_ACTIONS: dict[str, tuple[str, type[Any], type[Any], str]] = {
    # path word: (API method, its request, its response, the note shown after)
    "pause": ("JobService/PauseJob", jobs_pb2.PauseJobRequest, jobs_pb2.PauseJobResponse, "paused"),
    "resume": ("JobService/ResumeJob", jobs_pb2.ResumeJobRequest, jobs_pb2.ResumeJobResponse, "resumed"),
    "trigger": ("JobService/TriggerJob", jobs_pb2.TriggerJobRequest, jobs_pb2.TriggerJobResponse, "triggered"),
    "delete": ("JobService/DeleteJob", jobs_pb2.DeleteJobRequest, jobs_pb2.DeleteJobResponse, "deleted"),
}
RUN_ACTIONS: dict[str, tuple[str, type[Any], type[Any], str]] = {
    "cancel": ("RunService/CancelRun", runs_pb2.CancelRunRequest, runs_pb2.CancelRunResponse, "cancelled"),
    "retry": ("RunService/RetryRun", runs_pb2.RetryRunRequest, runs_pb2.RetryRunResponse, "retried"),
}
WORKFLOW_RUN_ACTIONS: dict[str, tuple[str, type[Any], type[Any], str]] = {
    "cancel": ("WorkflowService/CancelWorkflowRun", workflows_pb2.CancelWorkflowRunRequest,
               workflows_pb2.CancelWorkflowRunResponse, "cancelled"),
    "resume": ("WorkflowService/ResumeWorkflowRun", workflows_pb2.ResumeWorkflowRunRequest,
               workflows_pb2.ResumeWorkflowRunResponse, "resumed-workflow"),
}
SIGNIN_REASONS = {"expired": "Your token is no longer valid (revoked or expired): sign in again.",
                  "signedout": "Signed out."}
MAX_TOKEN_CHARS = 200


def add_routes(app: web.Application) -> None:
    app.router.add_get("/signin", signin_page)
    app.router.add_post("/signin", signin)
    app.router.add_post("/signout", signout)
    app.router.add_get("/jobs/new", new_job_page)
    app.router.add_post("/jobs/new", create_job)
    app.router.add_get("/jobs/{job_id}/edit", edit_job_page)
    app.router.add_post("/jobs/{job_id}/edit", update_job)
    app.router.add_post("/jobs/{job_id}/{action}", job_action)
    app.router.add_post("/runs/{run_id}/{action}", run_action)
    app.router.add_post("/workflow-runs/{workflow_run_id}/{action}", workflow_run_action)
    app.router.add_post("/workflow/trigger", trigger_workflow)


# -- signing in and out -------------------------------------------------------------------------


async def signin_page(request: web.Request, *, error: str = "", status: int = 200) -> web.Response:
    if request.app[CONSOLE].authenticator is None:
        return see_other("/")
    return render(request, "signin.html", status=status, error=error,
                  reason=SIGNIN_REASONS.get(request.query.get("reason", ""), ""))


async def signin(request: web.Request) -> web.StreamResponse:
    console = request.app[CONSOLE]
    if console.authenticator is None:
        return see_other("/")
    wait = console.signin_limit.take(request.remote or "")  # the peer: behind a proxy, the proxy
    if wait:  # refused before the token is looked up
        log.info("console sign-in from %s refused: too many attempts", request.remote)
        answer = await signin_page(request, status=429, error="Too many sign-in attempts from your address: "
                                   f"try again in {math.ceil(wait)} s.")
        answer.headers["Retry-After"] = str(math.ceil(wait))
        return answer
    form = await request.post()
    token = str(form.get("token", "")).strip()
    if not token or len(token) > MAX_TOKEN_CHARS:
        return await signin_page(request, error="Paste an API token (fl_<id>_<secret>).", status=400)
    try:
        caller = await console.authenticator.authenticate(f"Bearer {token}", source=request.remote)
    except Unauthenticated as error:
        log.info("console sign-in refused: %s", error)
        return await signin_page(request, error=str(error), status=401)
    except StorageUnavailable as error:
        return await signin_page(request, error=str(error), status=503)
    log.info("console sign-in of token %s (%s, tenant %s)", caller.token_id, caller.role, caller.tenant)
    session = console.sessions.start(token, tenant=caller.tenant)
    response = see_other("/")
    set_session_cookie(response, console, session)
    return response


async def signout(request: web.Request) -> web.StreamResponse:
    request.app[CONSOLE].sessions.end(session_of(request).session_id)
    response = see_other("/signin?reason=signedout")
    response.del_cookie(COOKIE, path="/")
    return response


# -- jobs -----------------------------------------------------------------------------------------



def _job_form_page(request: web.Request, form: JobForm, *, job_id: str | None, error: str = "",
                   status: int = 200) -> web.Response:
    return render(request, "job_form.html", status=status, form=form, job_id=job_id, error=error, kinds=KINDS)


async def new_job_page(request: web.Request) -> web.Response:
    return _job_form_page(request, JobForm(), job_id=None)


async def create_job(request: web.Request) -> web.StreamResponse:
    fields = {key: str(value) for key, value in (await request.post()).items() if isinstance(value, str)}
    try:
        form = JobForm.from_fields(fields)
        spec = wire.spec_to_pb(form.spec(tenant=""))
        answer = await call_api(request, "JobService/CreateJob", jobs_pb2.CreateJobRequest(spec=spec),
                                jobs_pb2.CreateJobResponse)
    except (InvalidArgument, CallRefused) as error:
        return _refused_form(request, fields, error, job_id=None)
    return see_other(f"/jobs/{answer.job.job_id}?done=created")


def _refuse_unless_may_edit(request: web.Request) -> None:
    """The edit form is for who may save it: a viewer is refused it (and so never sees a job's
    settings laid out for change), before any call."""
    caller = caller_of(request)
    if not request.app[CONSOLE].gateway.may(caller, "JobService/UpdateJob"):
        raise web.HTTPForbidden(text=f"a {caller.role} token may not edit jobs")


async def edit_job_page(request: web.Request) -> web.Response:
    _refuse_unless_may_edit(request)
    job_id = request.match_info["job_id"]
    job = wire.job_from_pb((await call_api(request, "JobService/GetJob", jobs_pb2.GetJobRequest(job_id=job_id),
                                           jobs_pb2.GetJobResponse)).job)
    return _job_form_page(request, JobForm.from_spec(job.spec), job_id=job_id)


async def update_job(request: web.Request) -> web.StreamResponse:
    _refuse_unless_may_edit(request)
    job_id = request.match_info["job_id"]
    fields = {key: str(value) for key, value in (await request.post()).items() if isinstance(value, str)}
    try:
        current = wire.job_from_pb((await call_api(request, "JobService/GetJob", jobs_pb2.GetJobRequest(job_id=job_id),
                                                   jobs_pb2.GetJobResponse)).job)
        form = JobForm.from_fields(fields)
        spec = wire.spec_to_pb(form.spec(tenant=current.tenant, based_on=current.spec))
        await call_api(request, "JobService/UpdateJob", jobs_pb2.UpdateJobRequest(job_id=job_id, spec=spec),
                       jobs_pb2.UpdateJobResponse)
    except (InvalidArgument, CallRefused) as error:
        return _refused_form(request, fields, error, job_id=job_id)
    return see_other(f"/jobs/{job_id}?done=updated")


def _refused_form(request: web.Request, fields: dict[str, str], error: InvalidArgument | CallRefused,
                  *, job_id: str | None) -> web.Response:
    try:
        form = JobForm.from_fields({key: value[:1000] for key, value in fields.items()})
    except InvalidArgument:
        form = JobForm()
    message = error.message if isinstance(error, CallRefused) else str(error)
    status = STATUS_OF_REFUSAL.get(error.code, 400) if isinstance(error, CallRefused) else 400
    return _job_form_page(request, form, job_id=job_id, error=message, status=status)


async def job_action(request: web.Request) -> web.StreamResponse:
    job_id, action = request.match_info["job_id"], request.match_info["action"]
    if action not in JOB_ACTIONS:
        raise web.HTTPNotFound(text=f"no job action {action!r}")
    method, request_type, response_type, done = JOB_ACTIONS[action]
    given = {"reason": str((await request.post()).get("reason", ""))} if action == "pause" else {}
    answer = await call_api(request, method, request_type(job_id=job_id, **given), response_type)
    if action == "delete":
        return see_other("/jobs?done=deleted")
    if action == "trigger":
        return see_other(f"/runs/{answer.run.run_id}?done=triggered")
    return see_other(f"/jobs/{job_id}?done={done}")


# -- runs -----------------------------------------------------------------------------------------


async def run_action(request: web.Request) -> web.StreamResponse:
    run_id, action = request.match_info["run_id"], request.match_info["action"]
    if action not in RUN_ACTIONS:
        raise web.HTTPNotFound(text=f"no run action {action!r}")
    method, request_type, response_type, done = RUN_ACTIONS[action]
    await call_api(request, method, request_type(run_id=run_id), response_type)
    return see_other(f"/runs/{run_id}?done={done}")


async def trigger_workflow(request: web.Request) -> web.StreamResponse:
    """A run of the workflow's latest version, now, without input (the CLI and the API take one)."""
    name = str((await request.post()).get("name", ""))
    answer = await call_api(request, "WorkflowService/TriggerWorkflow", workflows_pb2.TriggerWorkflowRequest(name=name),
                            workflows_pb2.TriggerWorkflowResponse)
    return see_other(f"/workflow-runs/{answer.run.workflow_run_id}?done=triggered-workflow")


async def workflow_run_action(request: web.Request) -> web.StreamResponse:
    workflow_run_id, action = request.match_info["workflow_run_id"], request.match_info["action"]
    if action not in WORKFLOW_RUN_ACTIONS:
        raise web.HTTPNotFound(text=f"no workflow run action {action!r}")
    method, request_type, response_type, done = WORKFLOW_RUN_ACTIONS[action]
    await call_api(request, method, request_type(workflow_run_id=workflow_run_id), response_type)
    return see_other(f"/workflow-runs/{workflow_run_id}?done={done}")
