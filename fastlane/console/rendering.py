"""What every console handler shares: the console's parts, the caller, and rendering a page."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import jinja2
from aiohttp import web

from fastlane._proto import jobs_pb2
from fastlane.auth.authenticator import Authenticator
from fastlane.auth.caller import Caller
from fastlane.console import formatting
from fastlane.console.activity import Activity
from fastlane.console.gateway import CallRefused, Gateway
from fastlane.console.sessions import Session, Sessions
from fastlane.console.signin_limit import SigninLimit
from fastlane.domain import lifecycle

HERE = Path(__file__).parent
STATUS_OF_REFUSAL = {
    grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 409, grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.UNAUTHENTICATED: 401,
}


@dataclass(frozen=True, slots=True)
class Console:
    """What every handler reaches through ``request.app[CONSOLE]``."""

    gateway: Gateway
    sessions: Sessions
    authenticator: Authenticator | None  # None: the node requires no tokens
    activity: Activity
    node_id: str
    secure: bool  # served over TLS: the cookie is Secure, every answer carries Strict-Transport-Security
    templates: jinja2.Environment
    unserved: Callable[[], Mapping[tuple[str, str], float]]  # ready runs no connected worker serves
    signin_limit: SigninLimit  # sign-in attempts per source address


CONSOLE = web.AppKey("console", Console)
CALLER = web.RequestKey("caller", Caller)
SESSION = web.RequestKey("session", Session)


def caller_of(request: web.Request) -> Caller:
    return request[CALLER]


def session_of(request: web.Request) -> Session:
    return request[SESSION]


async def call_api(request: web.Request, method: str, message: Any, response_type: type[Any]) -> Any:
    """Call the API's ``method`` (``"Service/Method"``) as the request's caller (see :class:`Gateway`)."""
    return await request.app[CONSOLE].gateway.call(caller_of(request), method, message, response_type)


async def job_id_named(request: web.Request, text: str) -> str:
    """The id of the job a filter names: by its name, else ``text`` is taken as an id (empty: none)."""
    if not text:
        return ""
    try:
        found = await call_api(request, "JobService/ListJobs", jobs_pb2.ListJobsRequest(name=text, page_size=1),
                               jobs_pb2.ListJobsResponse)
    except CallRefused as refusal:  # not a valid name: an id, or nothing any job has
        if refusal.code is not grpc.StatusCode.INVALID_ARGUMENT:
            raise
        return text
    return found.jobs[0].job_id if found.jobs else text


def render(request: web.Request, template: str, *, status: int = 200, **context: Any) -> web.Response:
    """A page, with what every page needs: the caller, the CSRF token, what the caller may do."""
    console = request.app[CONSOLE]
    caller = caller_of(request)
    session = request.get(SESSION)
    html = console.templates.get_template(template).render(
        caller=caller, csrf=session.csrf if session else "", node_id=console.node_id, path=request.path,
        may=lambda method: console.gateway.may(caller, method), auth=console.authenticator is not None,
        **context,
    )
    return web.Response(text=html, status=status, content_type="text/html")


def refusal_page(request: web.Request, refusal: CallRefused) -> web.Response:
    status = STATUS_OF_REFUSAL.get(refusal.code, 500)
    return render(request, "error.html", status=status, message=refusal.message, code=refusal.code.name)


def see_other(location: str) -> web.Response:
    """The redirect after an action (post/redirect/get): a plain response, so a middleware can
    add headers and cookies to it."""
    return web.Response(status=303, headers={"Location": location})


def make_templates() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True,
    )
    environment.filters.update(formatting.FILTERS)
    # A button is offered in the states where its call can succeed, as the lifecycle says.
    environment.globals.update(
        cancellable=lifecycle.WAITING | lifecycle.WITH_A_WORKER, replayable=lifecycle.REPLAYABLE,
        pausable=lifecycle.PAUSE_FROM, resumable=lifecycle.RESUME_FROM,
    )
    return environment
