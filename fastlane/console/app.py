"""The console's web application: the routes of its pages and actions behind :mod:`.guard`."""

from __future__ import annotations

from aiohttp import web

from fastlane.console import actions, bulk, pages
from fastlane.console.guard import guard
from fastlane.console.rendering import CONSOLE, HERE, Console

MAX_BODY_BYTES = 4 << 20  # a form: the job payload is most of it, and the API bounds that again


def build_app(console: Console) -> web.Application:
    app = web.Application(middlewares=[guard], client_max_size=MAX_BODY_BYTES)
    app[CONSOLE] = console
    pages.add_routes(app)
    bulk.add_routes(app)
    actions.add_routes(app)
    app.router.add_static("/static/", HERE / "static", append_version=False)
    return app
