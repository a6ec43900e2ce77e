"""The web console: jobs, runs, workflows and the cluster in a browser, served by the node itself.

Server-rendered pages (:mod:`.pages`) and actions (:mod:`.actions`) behind one guard (:mod:`.guard`:
sign-in with an API token, CSRF, origin), each page made of the API's own calls as the signed-in
caller (:mod:`.gateway`), so the console shows and does exactly what that token may through the API.
Sign-in attempts are limited per source address (:mod:`.signin_limit`), sessions per token and
tenant (:mod:`.sessions`).
"""

from __future__ import annotations

from pathlib import Path

from fastlane.auth.authenticator import Authenticator
from fastlane.console.activity import Activity
from fastlane.console.gateway import Gateway
from fastlane.console.rendering import Console, make_templates
from fastlane.console.server import ConsoleServer
from fastlane.console.sessions import Sessions
from fastlane.console.signin_limit import SigninLimit
from fastlane.runtime.metrics import Metrics


def console_server(listen: str, *, services: dict[str, object], authenticator: Authenticator | None,
                   metrics: Metrics, node_id: str, tls_files: tuple[Path, Path] | None) -> tuple[ConsoleServer, Activity]:
    """The console of one node (not started), and the sampler of its overview's chart (to run)."""
    activity = Activity(metrics)
    console = Console(gateway=Gateway(services), sessions=Sessions(), authenticator=authenticator, activity=activity,
                      node_id=node_id, secure=tls_files is not None, templates=make_templates(),
                      unserved=lambda: metrics.unserved.read(), signin_limit=SigninLimit())
    return ConsoleServer(console, listen, tls_files=tls_files), activity
