"""The web console over real HTTP, in front of a real node requiring tokens, on both backends.

What the console shows and does is what the API lets the signed-in token see and do: tenants stay
apart, a viewer cannot act, an action needs the session's CSRF token and this origin, a revoked
token ends its sessions, no token secret is ever rendered, and a payload only to a role that may
read it (not a viewer), never in the edit form.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import ssl
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import aiohttp
import pytest
from secured_nodes import ENGINE_SHARDS, SecuredNode, secured_node
from tls_certs import new_authority

from fastlane.auth.tls import ClientTls
from fastlane.domain.models import AttemptOutcome, JobSpec, JobState, OverlapPolicy, RunState, Schedule
from fastlane.domain.workflows import WORKFLOW_JOB_TYPE
from fastlane.errors import ConfigurationError
from fastlane.server.node import Node
from fastlane.server.settings import Settings
from fastlane.storage import AttemptResult, Dispatch
from fastlane.testing.processes import free_port

HOURLY = Schedule.interval(timedelta(hours=1))
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


class Visitor:
    """One browser: a cookie jar and the console's address."""

    def __init__(self, base: str, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self.base = base.rstrip("/")
        # unsafe: keep cookies of an IP address host (127.0.0.1), as browsers do.
        self.session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True),
                                             timeout=aiohttp.ClientTimeout(total=20))
        self.ssl = ssl_context if ssl_context is not None else True

    async def close(self) -> None:
        await self.session.close()

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(self.base + path, allow_redirects=False, ssl=self.ssl) as answer:
            return answer.status, await answer.text()

    async def post(self, path: str, data: dict[str, str], *, csrf: str | None = None,
                   headers: dict[str, str] | None = None) -> aiohttp.ClientResponse:
        form = dict(data)
        if csrf is not None:
            form["csrf"] = csrf
        async with self.session.post(self.base + path, data=form, allow_redirects=False, ssl=self.ssl,
                                     headers=headers or {}) as answer:
            await answer.read()
            return answer

    async def signin(self, secret: str) -> aiohttp.ClientResponse:
        return await self.post("/signin", {"token": secret})

    async def csrf(self) -> str:
        status, page = await self.get("/jobs/new")
        assert status == 200, page
        found = CSRF.search(page)
        assert found is not None
        return found.group(1)


@pytest.fixture
async def console(db_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SecuredNode]:
    monkeypatch.delenv("FASTLANE_TOKEN", raising=False)
    async with secured_node(db_url, console_listen="127.0.0.1:0") as node:
        yield node


@pytest.fixture
async def visitors(console: SecuredNode) -> AsyncIterator[dict[str, Visitor]]:
    """A signed-in visitor for each token of the node (and ``nobody``, not signed in)."""
    url = console.node.console_url
    assert url is not None
    made = {who: Visitor(url) for who in ("client-a", "viewer-a", "client-b", "admin", "nobody")}
    try:
        for who, visitor in made.items():
            if who != "nobody":
                answer = await visitor.signin(console.secrets[who])
                assert answer.status == 303, who
        yield made
    finally:
        for visitor in made.values():
            await visitor.close()


async def test_pages_need_a_signed_in_token_and_the_cookie_keeps_no_secret(console: SecuredNode):
    visitor = Visitor(console.node.console_url or "")
    try:
        for path in ("/", "/jobs", "/runs", "/cluster", "/workflows", "/jobs/new"):
            status, _ = await visitor.get(path)
            assert status == 303, path  # to the sign-in page
        refused = await visitor.signin("fl_abcdefghijkl_" + "0" * 64)
        assert refused.status == 401
        assert not visitor.session.cookie_jar.filter_cookies(visitor.base)  # type: ignore[arg-type]
        answer = await visitor.signin(console.secrets["client-a"])
        assert answer.status == 303 and answer.headers["Location"] == "/"
        cookie = answer.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" not in cookie  # no TLS here
        assert console.secrets["client-a"] not in cookie
        assert "Content-Security-Policy" in answer.headers
        assert "Strict-Transport-Security" not in answer.headers  # never over plain HTTP
        for path in ("/", "/jobs", "/runs", "/cluster", "/workflows", "/jobs/new"):
            status, page = await visitor.get(path)
            assert status == 200, (path, page[:500])
            assert console.secrets["client-a"] not in page
            assert console.secrets["client-a"].split("_")[2] not in page  # nor its secret part
    finally:
        await visitor.close()


async def test_a_job_made_in_the_console_runs_the_api_rules_and_stays_in_its_tenant(
        console: SecuredNode, visitors: dict[str, Visitor]):
    a, b, viewer, admin = visitors["client-a"], visitors["client-b"], visitors["viewer-a"], visitors["admin"]
    made = await a.post("/jobs/new", {"name": "nightly-report", "job_type": "reports", "schedule": "cron",
                                      "cron": "30 2 * * *", "timezone": "Europe/Berlin",
                                      "payload": '{"iban": "DE-SECRET-IBAN"}'}, csrf=await a.csrf())
    assert made.status == 303, made
    job_id = made.headers["Location"].split("/jobs/")[1].split("?")[0]
    async with console.client("client-a") as api:
        job = await api.get_job(job_id)
    assert job.tenant == "a" and job.spec.schedule.cron == "30 2 * * *" and job.spec.schedule.timezone == "Europe/Berlin"

    status, page = await a.get(f"/jobs/{job_id}")
    assert status == 200 and "nightly-report" in page and "Europe/Berlin" in page
    assert "DE-SECRET-IBAN" in page.split('id="job-payload"')[1].split("</pre>")[0]  # the owner's client sees it
    assert "DE-SECRET-IBAN" not in (await viewer.get(f"/jobs/{job_id}"))[1]  # a viewer does not
    assert 'id="pause"' in page and 'id="fire-times"' in page and "CET" in page  # Berlin's winter time
    # Where daylight saving moves a fire time, the page says so: 02:30 on 2027-03-14 does not exist
    # in New York (clocks jump from 02:00 to 03:00).
    async with console.client("client-a") as api:
        spring = await api.create("spring-forward", "t", Schedule.cron_expr("30 2 14 3 *", "America/New_York"))
    status, page = await a.get(f"/jobs/{spring.job_id}")
    assert status == 200 and "2027-03-14 03:00:00 EDT" in page and "fell in the gap" in page
    assert "nightly-report" in (await a.get("/jobs"))[1]
    assert "nightly-report" in (await a.get("/jobs?q=nightly"))[1]  # the start of its name
    assert "nightly-report" in (await a.get(f"/jobs?q={job_id[:6]}"))[1]  # or of its id
    assert "nightly-report" not in (await a.get("/jobs?q=daily"))[1]
    assert (await a.get("/jobs?q=%3Cscript%3E"))[0] == 200  # no name starts so: nothing found

    # Another tenant neither sees it nor reaches it by id, and cannot act on it.
    assert "nightly-report" not in (await b.get("/jobs"))[1]
    assert "nightly-report" not in (await b.get(f"/jobs?q={job_id[:8]}"))[1]
    assert "nightly-report" not in (await b.get("/jobs?q=nightly"))[1]
    assert (await b.get(f"/jobs/{job_id}"))[0] == 404
    assert (await b.get(f"/jobs/{job_id}/edit"))[0] == 404
    for action in ("pause", "delete", "trigger"):
        assert (await b.post(f"/jobs/{job_id}/{action}", {}, csrf=await b.csrf())).status == 404, action
    # A viewer of its tenant sees it, is offered no action, and is refused one it forges.
    status, page = await viewer.get(f"/jobs/{job_id}")
    assert status == 200 and "nightly-report" in page
    assert 'id="pause"' not in page and 'id="delete"' not in page and 'id="new-job"' not in (await viewer.get("/jobs"))[1]
    viewer_csrf = CSRF.search((await viewer.get("/"))[1])
    assert viewer_csrf is not None
    assert (await viewer.post(f"/jobs/{job_id}/pause", {}, csrf=viewer_csrf.group(1))).status == 403
    assert (await viewer.get("/jobs/new"))[0] == 200  # the form shows; creating is refused
    forged = await viewer.post("/jobs/new", {"name": "viewer-job", "job_type": "t", "schedule": "now"},
                               csrf=viewer_csrf.group(1))
    assert forged.status == 403
    # An admin token acts across tenants through the API; its console pages are its own tenant's.
    status, page = await admin.get("/cluster")
    assert status == 200 and "4 shards, " in page
    # The shard table is folded while every shard has its owner, open when one has none.
    assert ('id="shard-details" open' in page) == ("without an owner" in page) != ("every one owned" in page)
    async with console.client("client-a") as api:
        assert (await api.get_job(job_id)).state is JobState.ACTIVE
        assert not [j for j in (await api.list_jobs()).items if j.name == "viewer-job"]

    # The owner pauses, resumes, triggers and deletes it; each is in the job's history.
    csrf = await a.csrf()
    paused = await a.post(f"/jobs/{job_id}/pause", {"reason": "ledger <migration>"}, csrf=csrf)
    assert paused.headers["Location"] == f"/jobs/{job_id}?done=paused"
    async with console.client("client-a") as api:
        assert (await api.get_job(job_id)).state is JobState.PAUSED
    page = (await a.get(f"/jobs/{job_id}"))[1]
    assert "ledger &lt;migration&gt;" in page.split('id="pause-reason"')[1].split("</small>")[0]  # shown, escaped
    assert "ledger &lt;migration&gt;" in (await a.get("/jobs?state=paused"))[1]
    assert "paused" in page.split('id="job-version"')[1].split("</dd>")[0]  # its last change, not its last fire
    assert (await a.post(f"/jobs/{job_id}/resume", {}, csrf=csrf)).status == 303
    triggered = await a.post(f"/jobs/{job_id}/trigger", {}, csrf=csrf)
    run_id = triggered.headers["Location"].split("/runs/")[1].split("?")[0]
    status, page = await a.get(f"/runs/{run_id}")
    assert status == 200 and run_id in page
    assert (await b.get(f"/runs/{run_id}"))[0] == 404
    assert run_id[:8] not in (await b.get("/runs"))[1]
    assert (await b.post(f"/runs/{run_id}/cancel", {}, csrf=await b.csrf())).status == 404
    assert (await a.post(f"/runs/{run_id}/cancel", {}, csrf=csrf)).status == 303
    async with console.client("client-a") as api:
        assert (await api.get_run(run_id))[0].state is RunState.CANCELLED
    status, page = await a.get(f"/jobs/{job_id}")
    for action in ("paused", "resumed", "triggered"):
        assert f"<td>{action}</td>" in page, action
    assert (await a.post(f"/jobs/{job_id}/delete", {}, csrf=csrf)).status == 303
    assert (await a.get(f"/jobs/{job_id}"))[0] == 404


async def test_an_action_needs_this_sessions_csrf_token_and_this_origin(console: SecuredNode,
                                                                        visitors: dict[str, Visitor]):
    a, b = visitors["client-a"], visitors["client-b"]
    async with console.client("client-a") as api:
        job = await api.create("kept", "t", HOURLY)
    assert (await a.post(f"/jobs/{job.job_id}/pause", {})).status == 403  # no token
    assert (await a.post(f"/jobs/{job.job_id}/pause", {}, csrf=await b.csrf())).status == 403  # another session's
    assert (await a.post(f"/jobs/{job.job_id}/pause", {}, csrf=await a.csrf(),
                         headers={"Origin": "https://evil.example"})).status == 403
    assert (await visitors["nobody"].post(f"/jobs/{job.job_id}/pause", {}, csrf="x")).status == 403
    async with console.client("client-a") as api:
        assert (await api.get_job(job.job_id)).state is JobState.ACTIVE
    origin = a.base
    assert (await a.post(f"/jobs/{job.job_id}/pause", {}, csrf=await a.csrf(), headers={"Origin": origin})).status == 303


async def test_a_bad_form_is_shown_again_with_the_apis_reason_and_nothing_is_made(console: SecuredNode,
                                                                                  visitors: dict[str, Visitor]):
    a = visitors["client-a"]
    csrf = await a.csrf()
    for fields, reason in (
        ({"name": "x", "job_type": "t", "schedule": "cron", "cron": "99 * * * *"}, "cron"),
        ({"name": "x", "job_type": "t", "schedule": "cron", "cron": "* * * * *", "timezone": "Mars/Olympus"}, "Mars/Olympus"),
        ({"name": "x", "job_type": "t", "schedule": "interval", "every_seconds": "soon"}, "every_seconds"),
        ({"name": "x", "job_type": "t", "schedule": "now", "payload": "{not json"}, "payload"),
        ({"name": "<script>alert(1)</script>", "job_type": "t", "schedule": "now"}, "name"),
        ({"name": "x" * 5000, "job_type": "t", "schedule": "now"}, "name"),
    ):
        async with a.session.post(a.base + "/jobs/new", data={**fields, "csrf": csrf}, allow_redirects=False) as answer:
            page = await answer.text()
        assert answer.status == 400, (fields, page[:300])
        assert 'id="error"' in page and reason in page.split('id="error"')[1].split("</p>")[0], (reason, page[:600])
        assert "<script>alert" not in page  # shown back escaped
    async with console.client("client-a") as api:
        assert (await api.list_jobs()).items == []


async def test_a_filter_word_that_names_no_state_is_refused_with_the_error_page(console: SecuredNode,
                                                                              visitors: dict[str, Visitor]):
    a = visitors["client-a"]
    for path, field in (("/jobs?state=sleeping", "state"), ("/runs?state=<b>done</b>", "state")):
        status, page = await a.get(path)
        assert status == 400, (path, page[:300])
        message = page.split('id="error"')[1].split("</p>")[0]
        assert field in message and "is not one of" in message, (path, message)
        assert "<b>done</b>" not in page  # shown back escaped
    status, _ = await a.get("/runs?state=dead")
    assert status == 200


async def test_a_revoked_token_ends_its_console_sessions(console: SecuredNode, visitors: dict[str, Visitor]):
    a = visitors["client-a"]
    assert (await a.get("/jobs"))[0] == 200
    async with console.client("admin") as admin:
        await admin.revoke_token(console.tokens["client-a"].token_id)
    authenticator = console.node.authenticator
    assert authenticator is not None
    authenticator._cache.clear()  # the node's token cache would take up to 2 s to notice
    status, _ = await a.get("/jobs")
    assert status == 303
    status, page = await a.get("/signin?reason=expired")
    assert status == 200 and "no longer valid" in page
    assert (await a.signin(console.secrets["client-a"])).status == 401


async def test_signing_out_ends_the_session(console: SecuredNode, visitors: dict[str, Visitor]):
    a = visitors["client-a"]
    csrf = await a.csrf()
    answer = await a.post("/signout", {}, csrf=csrf)
    assert answer.status == 303 and answer.headers["Location"].startswith("/signin")
    assert (await a.get("/jobs"))[0] == 303


async def test_under_tls_the_console_is_https_and_its_cookie_secure(db_url: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("FASTLANE_TOKEN", raising=False)
    ca = new_authority("console test CA")
    ca.issue_server().write(tmp_path / "server.crt", tmp_path / "server.key")
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    async with secured_node(db_url, console_listen="127.0.0.1:0", tls_cert=tmp_path / "server.crt",
                            tls_key=tmp_path / "server.key",
                            client_tls=ClientTls(ca_file=tmp_path / "ca.crt")) as node:
        url = node.node.console_url or ""
        assert url.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        visitor = Visitor(url, ssl_context=trusted)
        try:
            answer = await visitor.signin(node.secrets["client-a"])
            assert answer.status == 303 and "Secure" in answer.headers["Set-Cookie"]
            assert answer.headers["Strict-Transport-Security"] == "max-age=31536000"
            assert (await visitor.get("/jobs"))[0] == 200
            for path in ("/signin", "/jobs", "/static/console.css", "/no-such-page"):  # every answer
                async with visitor.session.get(visitor.base + path, allow_redirects=False, ssl=trusted) as page:
                    assert page.headers.get("Strict-Transport-Security") == "max-age=31536000", path
        finally:
            await visitor.close()
        plain = Visitor(url.replace("https://", "http://"))
        try:
            with pytest.raises(aiohttp.ClientError):
                await plain.get("/signin")
        finally:
            await plain.close()


async def test_without_tokens_the_console_opens_without_sign_in(db_url: str):
    node = Node(Settings(db_url=db_url, listen=f"127.0.0.1:{free_port()}", node_id="open-node",
                         shard_count=ENGINE_SHARDS, console_listen="127.0.0.1:0"))
    task = asyncio.create_task(node.run())
    try:
        async with asyncio.timeout(30):
            await node.ready.wait()
        visitor = Visitor(node.console_url or "")
        try:
            status, page = await visitor.get("/")
            assert status == 200 and "authentication off" in page
            assert (await visitor.get("/signin"))[0] == 303
            made = await visitor.post("/jobs/new", {"name": "open", "job_type": "t", "schedule": "interval",
                                                    "every_seconds": "60"}, csrf=await visitor.csrf())
            assert made.status == 303
            assert (await visitor.post("/jobs/new", {"name": "open2", "job_type": "t", "schedule": "now"})).status == 403
        finally:
            await visitor.close()
    finally:
        node.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)


async def test_a_job_is_edited_from_its_form_and_keeps_what_the_form_does_not_show(console: SecuredNode,
                                                                                    visitors: dict[str, Visitor]):
    a, b = visitors["client-a"], visitors["client-b"]
    async with console.client("client-a") as api:
        job = await api.create("rollup", "t", Schedule.cron_expr("0 * * * *", "UTC"), overlap=OverlapPolicy.SKIP)
    status, page = await a.get(f"/jobs/{job.job_id}/edit")
    assert status == 200 and 'value="0 * * * *"' in page
    form = {"name": "rollup", "job_type": "t", "schedule": "cron", "cron": "15 3 * * *", "timezone": "Asia/Tokyo",
            "max_attempts": "7", "priority": "5"}
    edited = await a.post(f"/jobs/{job.job_id}/edit", form, csrf=await a.csrf())
    assert edited.status == 303 and edited.headers["Location"] == f"/jobs/{job.job_id}?done=updated"
    async with console.client("client-a") as api:
        changed = await api.get_job(job.job_id)
    assert changed.spec.schedule.cron == "15 3 * * *" and changed.spec.schedule.timezone == "Asia/Tokyo"
    assert changed.spec.retry.max_attempts == 7 and changed.spec.priority == 5 and changed.version == job.version + 1
    assert changed.spec.overlap is OverlapPolicy.SKIP  # not on the form: kept
    assert (await b.post(f"/jobs/{job.job_id}/edit", form, csrf=await b.csrf())).status == 404  # not b's job


async def test_workflow_pages_show_a_tenants_workflows_and_their_runs_only(console: SecuredNode,
                                                                          visitors: dict[str, Visitor]):
    a, b, viewer = visitors["client-a"], visitors["client-b"], visitors["viewer-a"]
    definition = {"name": "month-end/close", "steps": [{"name": "debit", "job_type": "t"},
                                                       {"name": "report", "job_type": "t", "after": ["debit"]}]}
    async with console.client("client-a") as api:
        await api.create_workflow(definition)
        run = await api.trigger_workflow("month-end/close", {"month": "2026-11"})
    status, page = await a.get("/workflows")
    assert status == 200 and "month-end/close" in page
    status, page = await a.get("/workflow?name=month-end%2Fclose")
    assert status == 200 and run.workflow_run_id[:8] in page
    shown = page.split('id="workflow-definition">')[1].split("</pre>")[0]
    assert '\n  &#34;steps&#34;: [' in shown  # the definition indented, one key a line
    assert 'id="trigger-workflow"' in page and 'id="trigger-workflow"' not in (await viewer.get(
        "/workflow?name=month-end%2Fclose"))[1]
    started = await a.post("/workflow/trigger", {"name": "month-end/close"}, csrf=await a.csrf())
    assert started.status == 303 and started.headers["Location"].endswith("?done=triggered-workflow")
    status, page = await a.get(started.headers["Location"])
    assert status == 200 and "A run of the workflow was started." in page
    assert (await b.post("/workflow/trigger", {"name": "month-end/close"}, csrf=await b.csrf())).status == 404
    status, page = await a.get(f"/workflow-runs/{run.workflow_run_id}")
    assert status == 200 and "debit" in page and "report" in page
    assert "month-end/close" not in (await b.get("/workflows"))[1]
    assert (await b.get("/workflow?name=month-end%2Fclose"))[0] == 404
    assert (await b.get(f"/workflow-runs/{run.workflow_run_id}"))[0] == 404
    cancelled = await b.post(f"/workflow-runs/{run.workflow_run_id}/cancel", {}, csrf=await b.csrf())
    assert cancelled.status == 404
    assert (await a.post(f"/workflow-runs/{run.workflow_run_id}/cancel", {}, csrf=await a.csrf())).status == 303
    async with console.client("client-a") as api:
        assert (await api.get_workflow_run(run.workflow_run_id))[0].state == "cancelled"


async def test_the_overview_lists_dead_runs_but_not_a_workflow_runs_own(console: SecuredNode,
                                                                         visitors: dict[str, Visitor]):
    a = visitors["client-a"]
    async with console.client("client-a") as api:
        job = await api.create("fragile", "t", Schedule.interval(timedelta(hours=1)))
        mine = await api.trigger_job(job.job_id)
    # A workflow run's own run (its internal job type) ends dead with the workflow run: made here
    # in the store, as a failed workflow run leaves it.
    internal, _ = await console.store.jobs.create_job(JobSpec(
        tenant="a", name="nightly", job_type=WORKFLOW_JOB_TYPE, schedule=Schedule.interval(timedelta(hours=1))))
    own = await console.store.runs.create_manual_run("a", internal.job_id)
    for run in (mine, own):
        await console.store.attempts.record_dispatches([Dispatch(
            run_id=run.run_id, lease_token=1, worker_id="w", node_id="n", lease_ttl=timedelta(seconds=30),
            dispatched_at=run.created_at)])
        await console.store.attempts.record_results([AttemptResult(
            run_id=run.run_id, lease_token=1, outcome=AttemptOutcome.PERMANENT_FAILURE)])
    assert {(await console.store.runs.get_run("a", r.run_id)).state for r in (mine, own)} == {RunState.DEAD}
    status, page = await a.get("/")
    assert status == 200 and mine.run_id[:8] in page
    assert own.run_id[:8] not in page  # the workflow's own pages tell of it


async def test_a_console_address_in_use_stops_the_node_with_a_reason_and_frees_the_api(db_url: str):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        api_port = free_port()
        node = Node(Settings(db_url=db_url, listen=f"127.0.0.1:{api_port}", shard_count=ENGINE_SHARDS,
                             console_listen=f"127.0.0.1:{taken.getsockname()[1]}"))
        with pytest.raises(ConfigurationError, match="--console .*cannot listen"):
            await asyncio.wait_for(node.run(), 30)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", api_port))  # the API's port was let go


async def test_sign_in_attempts_from_one_address_are_limited(console: SecuredNode):
    visitor = Visitor(console.node.console_url or "")
    try:
        for _ in range(10):  # the burst: wrong tokens, each looked up and refused
            assert (await visitor.signin("fl_abcdefghijkl_" + "0" * 64)).status == 401
        async with visitor.session.post(visitor.base + "/signin", data={"token": console.secrets["client-a"]},
                                        allow_redirects=False) as answer:
            page = await answer.text()
        # beyond it even a valid token is refused before it is looked up: no session, a wait named
        assert answer.status == 429, page[:300]
        assert 1 <= int(answer.headers["Retry-After"]) <= 6
        assert "Set-Cookie" not in answer.headers and "Too many sign-in attempts" in page
        assert (await visitor.get("/jobs"))[0] == 303  # still signed out
        assert (await visitor.get("/signin"))[0] == 200  # the page itself is not limited
    finally:
        await visitor.close()


async def test_a_viewer_is_refused_the_edit_form_and_it_shows_no_one_a_payload(console: SecuredNode,
                                                                                visitors: dict[str, Visitor]):
    a, viewer = visitors["client-a"], visitors["viewer-a"]
    async with console.client("client-a") as api:
        job = await api.create("ledger", "t", HOURLY, payload={"iban": "DE-SECRET-IBAN"})
    status, page = await viewer.get(f"/jobs/{job.job_id}/edit")
    assert status == 403 and "DE-SECRET-IBAN" not in page
    viewer_csrf = CSRF.search((await viewer.get("/"))[1])
    assert viewer_csrf is not None
    form = {"name": "ledger", "job_type": "t", "schedule": "interval", "every_seconds": "60"}
    assert (await viewer.post(f"/jobs/{job.job_id}/edit", form, csrf=viewer_csrf.group(1))).status == 403

    status, page = await a.get(f"/jobs/{job.job_id}/edit")
    assert status == 200 and "DE-SECRET-IBAN" not in page and "leave empty to keep the current payload" in page
    assert (await a.post(f"/jobs/{job.job_id}/edit", form, csrf=await a.csrf())).status == 303  # payload left empty
    async with console.client("client-a") as api:
        kept = await api.get_job(job.job_id)
    assert kept.spec.payload == job.spec.payload and kept.spec.schedule.every == timedelta(seconds=60)
    assert (await a.post(f"/jobs/{job.job_id}/edit", {**form, "payload": '{"n": 2}'}, csrf=await a.csrf())).status == 303
    async with console.client("client-a") as api:
        assert (await api.get_job(job.job_id)).spec.payload == b'{"n": 2}'
    assert (await a.post(f"/jobs/{job.job_id}/edit", {**form, "clear_payload": "on"}, csrf=await a.csrf())).status == 303
    async with console.client("client-a") as api:
        assert (await api.get_job(job.job_id)).spec.payload == b""


async def test_bulk_actions_count_first_act_on_confirm_and_stay_in_the_tenant(console: SecuredNode,
                                                                             visitors: dict[str, Visitor]):
    a, b, viewer = visitors["client-a"], visitors["client-b"], visitors["viewer-a"]
    async with console.client("client-a") as api:
        reports = await api.create("reports", "reports", HOURLY)
        other = await api.create("other", "mail", HOURLY)
        mine = [(await api.trigger_job(reports.job_id)).run_id for _ in range(3)]
        kept = (await api.trigger_job(other.job_id)).run_id
    async with console.client("client-b") as api:
        theirs = (await api.trigger_job((await api.create("reports", "reports", HOURLY)).job_id)).run_id

    status, page = await a.get("/runs?type=reports")
    assert status == 200 and 'id="bulk-cancel"' in page and 'id="bulk-retry"' in page
    shown = re.compile(r'data-run-id="([^"]+)"')
    by_name = shown.findall((await a.get("/runs?job=reports"))[1])  # a job's name finds its runs, as its id does
    assert sorted(by_name) == sorted(mine) == sorted(shown.findall((await a.get(f"/runs?job={reports.job_id}"))[1]))
    status, page = await a.get("/runs?state=dead")  # dead runs may be retried, not cancelled
    assert 'id="bulk-retry"' in page and 'id="bulk-cancel"' not in page
    assert 'id="bulk-actions"' not in (await viewer.get("/runs"))[1]
    viewer_csrf = CSRF.search((await viewer.get("/"))[1])
    assert viewer_csrf is not None
    assert (await viewer.post("/runs/bulk/cancel", {"type": "reports", "confirm": "1"},
                              csrf=viewer_csrf.group(1))).status == 403
    assert (await a.post("/runs/bulk/cancel", {"type": "reports", "confirm": "1"})).status == 403  # no CSRF token
    assert (await a.post("/runs/bulk/delete", {}, csrf=await a.csrf())).status == 404
    async with a.session.post(a.base + "/runs/bulk/cancel", data={"state": "sleeping", "csrf": await a.csrf()},
                              allow_redirects=False) as answer:
        assert answer.status == 400 and "is not one of" in await answer.text()

    async with a.session.post(a.base + "/runs/bulk/cancel", data={"type": "reports", "csrf": await a.csrf()},
                              allow_redirects=False) as answer:
        page = await answer.text()
    assert answer.status == 200 and 'id="bulk-confirm"' in page, page[:500]
    assert "3 runs are to be cancelled" in page.split('id="bulk-count"')[1].split("</p>")[0]
    async with console.client("client-a") as api:  # counting changed nothing
        assert {(await api.get_run(run_id))[0].state for run_id in mine} != {RunState.CANCELLED}

    done = await a.post("/runs/bulk/cancel", {"type": "reports", "confirm": "1"}, csrf=await a.csrf())
    assert done.status == 303
    status, page = await a.get(done.headers["Location"])
    assert status == 200 and "3 runs cancelled." in page.split('id="note"')[1].split("</p>")[0]
    async with console.client("client-a") as api:
        assert {(await api.get_run(run_id))[0].state for run_id in mine} == {RunState.CANCELLED}
        assert (await api.get_run(kept))[0].state is not RunState.CANCELLED  # another type
    async with console.client("client-b") as api:
        assert (await api.get_run(theirs))[0].state is not RunState.CANCELLED  # another tenant's
    async with a.session.post(a.base + "/runs/bulk/cancel", data={"type": "reports", "csrf": await a.csrf()},
                              allow_redirects=False) as answer:
        page = await answer.text()
    assert answer.status == 200 and "0 runs are" in page and 'id="bulk-confirm"' not in page  # nothing left
    status, page = await b.get("/runs?type=reports")
    assert theirs[:8] in page and not any(run_id[:8] in page for run_id in mine)


async def test_bulk_job_actions_count_first_act_on_confirm_and_stay_in_the_tenant(console: SecuredNode,
                                                                                 visitors: dict[str, Visitor]):
    a, viewer = visitors["client-a"], visitors["viewer-a"]
    async with console.client("client-a") as api:
        closes = [(await api.create(f"close-{index}", "billing.close", HOURLY)).job_id for index in range(3)]
        kept = (await api.create("mailer", "mail", HOURLY)).job_id
    async with console.client("client-b") as api:
        theirs = (await api.create("close-b", "billing.close", HOURLY)).job_id

    status, page = await a.get("/jobs?type=billing.close")
    assert status == 200 and all(f'id="bulk-{verb}"' in page for verb in ("pause", "resume", "delete"))
    status, page = await a.get("/jobs?state=paused")  # paused jobs may be resumed or deleted, not paused
    assert 'id="bulk-resume"' in page and 'id="bulk-delete"' in page and 'id="bulk-pause"' not in page
    assert 'id="bulk-actions"' not in (await a.get("/jobs?q=close"))[1]  # a name search is not a selection
    assert 'id="bulk-actions"' not in (await viewer.get("/jobs"))[1]
    assert (await a.post("/jobs/bulk/cancel", {}, csrf=await a.csrf())).status == 404  # a run's verb

    async with a.session.post(a.base + "/jobs/bulk/pause", data={"type": "billing.close", "csrf": await a.csrf()},
                              allow_redirects=False) as answer:
        page = await answer.text()
    assert answer.status == 200 and 'id="bulk-confirm"' in page, page[:500]
    assert "3 jobs are to be paused" in page.split('id="bulk-count"')[1].split("</p>")[0]
    done = await a.post("/jobs/bulk/pause", {"type": "billing.close", "confirm": "1"}, csrf=await a.csrf())
    assert done.status == 303
    status, page = await a.get(done.headers["Location"])
    assert status == 200 and "3 jobs paused." in page.split('id="note"')[1].split("</p>")[0]
    done = await a.post("/jobs/bulk/delete", {"type": "billing.close", "state": "paused", "confirm": "1"},
                        csrf=await a.csrf())
    assert "3 jobs deleted." in (await a.get(done.headers["Location"]))[1]
    async with console.client("client-a") as api:
        assert [job.job_id for job in (await api.list_jobs()).items] == [kept]
        for job_id in closes:
            assert [event.action.value for event in await api.list_audit("job", job_id)][:2] == ["deleted", "paused"]
    async with console.client("client-b") as api:
        assert (await api.get_job(theirs)).state is JobState.ACTIVE  # another tenant's
