"""In front of every console page and action: who is asking (sign-in), may they (CSRF, roles), and the page.

One middleware stands in front of every page and action, as the access interceptor stands in
front of every API call: it finds the session of the request's cookie, checks the session's token
again (revoked or expired: signed out), refuses an action whose form does not carry the session's
CSRF token or that comes from another origin, and adds the headers every answer carries (a strict
Content-Security-Policy among them: the pages run no inline script; under TLS, Strict-Transport-Security
too, so a browser that has been here once never comes back over plain HTTP). What a page shows is then
whatever the API answers the caller (:mod:`fastlane.console.gateway`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from fastlane.auth.caller import ANONYMOUS, Caller
from fastlane.console.gateway import CallRefused
from fastlane.console.rendering import CALLER, CONSOLE, SESSION, Console, refusal_page, render, see_other
from fastlane.console.sessions import COOKIE, Session
from fastlane.domain.access import Role
from fastlane.domain.errors import StorageUnavailable, Unauthenticated, new_error_id

log = logging.getLogger("fastlane.console")

OPEN_PATHS = frozenset({"/signin", "/favicon.ico"})
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # "no-referrer" makes browsers send "Origin: null" with forms
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
# Only over TLS: a plain HTTP console (loopback, development) must not tell a browser to insist on
# HTTPS for its host. A year, as browsers' preload lists ask.
TLS_HEADERS = {"Strict-Transport-Security": "max-age=31536000"}

# Who a request is before sign-in: pages open to it (sign-in) make no API call, and if one did it
# could do nothing (a viewer of no tenant).
SIGNED_OUT = Caller(token_id=None, name="", tenant="", role=Role.VIEWER)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _signin_redirect(request: web.Request, reason: str = "") -> web.Response:
    response = see_other("/signin" + (f"?reason={reason}" if reason else ""))
    response.del_cookie(COOKIE, path="/")
    return response


def set_session_cookie(response: web.StreamResponse, console: Console, session: Session) -> None:
    response.set_cookie(COOKIE, session.session_id, path="/", httponly=True, samesite="Strict",
                        secure=console.secure)


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Session, token, CSRF and origin checks, then the handler; security headers on every answer."""
    try:
        response = await _guarded(request, handler)
    except web.HTTPException as answer:  # a refusal or not-found raised below: answered as plain text
        response = web.Response(status=answer.status, text=answer.text or answer.reason)
    except CallRefused as refusal:
        response = refusal_page(request, refusal)
    except Exception:
        error_id = new_error_id()
        log.exception("console page %s failed unexpectedly (error id %s)", request.path, error_id)
        request.setdefault(CALLER, SIGNED_OUT)
        response = render(request, "error.html", status=500, code="INTERNAL",
                          message=f"internal error {error_id}: see the node's log")
    response.headers.update(HEADERS)
    if request.app[CONSOLE].secure:
        response.headers.update(TLS_HEADERS)
    return response


async def _guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
    console = request.app[CONSOLE]
    if request.path.startswith("/static/"):
        return await handler(request)
    session = console.sessions.find(request.cookies.get(COOKIE))
    new_session = None
    if console.authenticator is None:  # no tokens on this node: every visitor is the anonymous admin
        if session is None:
            session = new_session = console.sessions.start(None, tenant=None)
        request[CALLER] = ANONYMOUS
    elif request.path in OPEN_PATHS:
        request[CALLER] = SIGNED_OUT
    elif session is None or session.token is None:
        if request.method == "POST":
            raise web.HTTPForbidden(text="sign in first")
        return _signin_redirect(request)
    else:
        try:
            request[CALLER] = await console.authenticator.authenticate(f"Bearer {session.token}")
        except Unauthenticated as error:
            log.info("console session of a token no longer valid ended: %s", error)
            console.sessions.end(session.session_id)
            return _signin_redirect(request, "expired")
        except StorageUnavailable as error:
            request[CALLER] = SIGNED_OUT
            return render(request, "error.html", status=503, code="UNAVAILABLE", message=str(error))
    if session is not None:
        request[SESSION] = session
    if request.method == "POST":
        _check_origin(request)
        if request.path not in OPEN_PATHS:
            form = await request.post()
            if session is None or not session.csrf_matches(_text(form.get("csrf"))):
                raise web.HTTPForbidden(text="the form's CSRF token is missing or stale: reload the page and try again")
    response = await handler(request)
    if new_session is not None:
        set_session_cookie(response, console, new_session)
    return response


def _check_origin(request: web.Request) -> None:
    """A browser names the page a form was sent from: it must be this console."""
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        raise web.HTTPForbidden(text=f"an action from another origin ({origin}) is refused")


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


