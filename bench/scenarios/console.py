"""``console``: how fast the node's web console renders its pages over a big database.

PostgreSQL is loaded with 100,000 jobs and 1,000,000 finished runs (``x scale``), one node is
started with ``--auth --console``, the harness signs in with a client token of tenant ``acme``
as a browser would (GET and POST /signin, then the session cookie), and each page is fetched
``REQUESTS`` times after ``WARMUPS``, in rounds over all the pages so that a slow moment of the
machine falls on every page alike rather than on one. Each time is the whole answer: request
sent to last byte read. The target: every page's p95 at most 200 ms.

The rows are copies of real ones made through the store (:mod:`fastlane.testing.history`):
four template jobs (cron, two intervals, a one-shot) and one finished run with its attempt,
copied in SQL with their own ids, names, tenants, states and instants. Set-wise copies in SQL load
a million runs far faster than making each through the store, and copying real rows keeps them
valid whatever later migrations add to the schema.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from html.parser import HTMLParser
from urllib.parse import quote, urljoin, urlsplit

import aiohttp
import asyncpg
from fastlane.bench.cluster import serve_accepts
from fastlane.bench.harness import JOB_TYPE, SHARDS, START_ALLOWANCE_S, Bench, Deadline, now_utc
from fastlane.bench.processes import Daemon, free_port
from fastlane.bench.stats import percentiles
from fastlane.bench.usage import ProcessMemory, cpu_seconds, peak_rss

from fastlane.auth.issuing import issue_token
from fastlane.domain.access import Role
from fastlane.domain.models import JobSpec, Schedule, shard_of
from fastlane.storage import open_store
from fastlane.testing.history import insert_copies, one_finished_run

JOBS = 100_000
RUNS = 1_000_000
TENANT = "acme"  # the tenant signed in; one job in ten belongs to OTHER, which the pages must leave out
OTHER = "other"
TEMPLATES_TENANT = "bench-templates"  # the template jobs, deleted once copied
HEAVY_EVERY = 100  # one run in this many belongs to the first job: ~10,000 runs for its pages
RUNS_OVER = timedelta(days=7)  # the runs' instants spread over the last week (inside the 30-day retention)
# Names as people give them: job n is "{area}-{verb}-{n // combinations:05d}", and its type "{area}.{verb}".
AREAS = ("billing", "reports", "sync", "mail", "etl", "cleanup")
VERBS = ("invoice", "export", "pull", "digest")
# The jobs page's search box takes the start of a name or of an id (a UUID): a whole name, the
# start that a sixth of the jobs share ("billing-", a page of 50 of ~15,000) and an id's first
# characters, which about 1 job in 4,096 shares (~20 at full scale), are each timed.
ID_PREFIX_LENGTH = 3
JOB_BATCH = 20_000
RUN_BATCH = 100_000
WARMUPS = 2
REQUESTS = 20
COOKIE = "fastlane_session"  # the console's session cookie (fastlane.console.sessions.COOKIE)
CONSOLE_START_S = 60.0
LOAD_WORST_S_PER_ROW = 0.0002  # a bound for the hard deadline only
REQUEST_WORST_S = 3.0  # likewise, for one page


@dataclass(frozen=True, slots=True)
class Loaded:
    """What the pages are asked about, found while loading."""

    heavy_job: str  # the job with ~1 % of the runs
    heavy_runs: int
    heavy_name: str
    run_id: str  # one of its runs (a dead one when it has one): the run page
    seconds: float


async def console(bench: Bench) -> list[dict[str, object]]:
    if bench.pg is None:  # the command refuses sqlite before it gets here; this guards a direct call
        raise RuntimeError("the console scenario needs --backend postgres")
    if not await serve_accepts("--console"):
        raise RuntimeError("this build's `fastlane serve` has no --console flag: there is no console to measure")
    url = await bench.fresh_database("console")
    jobs, runs = bench.scaled(JOBS, minimum=1_000), bench.scaled(RUNS, minimum=10_000)
    loaded = await load(bench, url, jobs, runs)
    token = await _client_token(url)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    node = Daemon(url, bench.workdir / "console-node.log", shards=SHARDS, client_options={"token": token},
                  extra_args=["--auth", "--console", f"127.0.0.1:{port}"])
    bench.progress.phase("starting the node with its console")
    node.start()
    try:
        await node.wait_ready(timeout=START_ALLOWANCE_S)
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(),
                                         timeout=aiohttp.ClientTimeout(total=60)) as http:
            await _wait_for_console(http, base, node)
            cookie = await _sign_in(http, base, token, node)
            pages = await _pages(http, base, cookie, loaded, node)
            timed = await _measure(bench, http, cookie, pages, node)
    finally:
        bench.memory.append(ProcessMemory("fastlane node", node.pid, peak_rss(node.pid), cpu_seconds(node.pid)))
        node.stop()
    bench.note("jobs and runs were copied in SQL from template rows made through the store, before the node "
               "started (see fastlane.testing.history); the job creation line above does not apply")
    return [{"system": "fastlane", "scenario": bench.scenario, "backend": bench.backend, "stored_jobs": jobs,
             "stored_runs": runs, "heavy_job_runs": loaded.heavy_runs, "load_s": round(loaded.seconds, 1),
             "requests_per_page": REQUESTS, "token_role": f"{Role.CLIENT.value} of {TENANT}", "pages": timed}]


def budget(bench: Bench) -> float:
    rows = bench.scaled(JOBS, minimum=1_000) + bench.scaled(RUNS, minimum=10_000)
    requests = 20 * (WARMUPS + REQUESTS + 1)  # the pages (fewer than 20), and the fetch of /jobs's link
    return 2 * START_ALLOWANCE_S + rows * LOAD_WORST_S_PER_ROW + requests * REQUEST_WORST_S


# -- loading -------------------------------------------------------------------------------------


async def load(bench: Bench, url: str, jobs: int, runs: int) -> Loaded:
    """Migrate, make the templates through the store, copy them into ``jobs`` jobs and ``runs`` runs."""
    started = time.monotonic()
    bench.progress.phase("making the template rows through the store")
    run_template = await one_finished_run(url)  # migrates the database too
    job_templates = await _template_jobs(url)
    ids = [str(uuid.uuid4()) for _ in range(jobs)]
    db = await asyncpg.connect(url)
    try:
        await _copy_jobs(bench, db, ids, job_templates)
        await _copy_runs(bench, db, run_template, ids, runs)
        # A console over a database in steady state: statistics and the visibility map as autovacuum
        # keeps them, rather than whatever it happens to reach while the pages are timed.
        bench.progress.phase("VACUUM ANALYZE jobs, runs, attempts")
        for table in ("jobs", "runs", "attempts"):
            await db.execute(f"VACUUM ANALYZE {table}")
        heavy_runs = int(await db.fetchval("SELECT count(*) FROM runs WHERE job_id = $1", ids[0]))
        run_id = await db.fetchval("SELECT run_id FROM runs WHERE job_id = $1 "
                                   "ORDER BY state = 'dead' DESC, scheduled_for DESC LIMIT 1", ids[0])
    finally:
        await db.close()
    bench.progress.end()
    return Loaded(heavy_job=ids[0], heavy_runs=heavy_runs, run_id=str(run_id), heavy_name=_name(0),
                  seconds=time.monotonic() - started)


def _name(n: int) -> str:
    combination = n % (len(AREAS) * len(VERBS))
    return f"{AREAS[combination % len(AREAS)]}-{VERBS[combination // len(AREAS)]}-{n // (len(AREAS) * len(VERBS)):05d}"


async def _template_jobs(url: str) -> list[tuple[str, timedelta]]:
    """One job of each kind of schedule, made through the store, with its period (0: one-shot):
    the copies take its policies, and fire times that its schedule could give."""
    store = open_store(url, shard_count=SHARDS)
    kinds = ((Schedule.cron_expr("0 3 * * *"), timedelta(days=1)), (Schedule.interval(timedelta(hours=1)),
             timedelta(hours=1)), (Schedule.interval(timedelta(hours=6)), timedelta(hours=6)),
             (Schedule.at_instant(now_utc() + timedelta(days=30)), timedelta(0)))
    templates = []
    try:
        for index, (schedule, period) in enumerate(kinds):
            job, _ = await store.jobs.create_job(JobSpec(name=f"template-{index}", job_type=JOB_TYPE, tenant=TEMPLATES_TENANT,
                                                    schedule=schedule, payload=b'{"customer": 4217, "dry_run": false}'))
            templates.append((job.job_id, period))
    finally:
        await store.close()
    return templates


async def _copy_jobs(bench: Bench, db: asyncpg.Connection, ids: list[str], templates: list[tuple[str, timedelta]]) -> None:
    """Job n a copy of template n mod 4, in tenant acme but one in ten, paused one in twenty,
    errored one in a hundred. Its next fire time is its template's plus 1 to 30 periods: an hour
    to a month away (a one-shot's: in a month), so the node fires none while the pages are timed."""
    bench.progress.phase(f"copying {len(ids):,} jobs")
    number = "($9::bigint + c.n)"  # the job's n: the ordinality counts within the batch
    overrides = {
        "job_id": "c.job_id", "name": "c.name", "tenant": "c.tenant", "shard_id": "c.shard_id", "state": "c.state",
        "job_type": "c.job_type", "priority": f"({number} % 3)::int",
        "next_fire_at": f"t.next_fire_at + (1 + {number} % 30) * c.period",
        **dict.fromkeys(("created_at", "updated_at"), f"$1::timestamptz - ({number} % 2160) * interval '1 hour'"),
        "error": "CASE WHEN c.state = 'errored' THEN 'bench: set aside, its payload no longer decodes' END",
    }
    source = ("jobs t JOIN unnest($2::text[], $3::int[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], "
              "$10::interval[]) WITH ORDINALITY AS c(job_id, shard_id, name, tenant, state, job_type, template, period, n) "
              "ON t.job_id = c.template")
    now = now_utc()
    for start in range(0, len(ids), JOB_BATCH):
        numbers = range(start, min(start + JOB_BATCH, len(ids)))
        names = [_name(n) for n in numbers]
        await insert_copies(db, "jobs", overrides, source, now, [ids[n] for n in numbers],
                            [shard_of(ids[n], SHARDS) for n in numbers], names,
                            [OTHER if n % 10 == 9 else TENANT for n in numbers],
                            ["errored" if n % 100 == 42 else "paused" if n % 20 == 3 else "active" for n in numbers],
                            [name.rsplit("-", 1)[0].replace("-", ".") for name in names],
                            [templates[n % len(templates)][0] for n in numbers], start - 1,
                            [templates[n % len(templates)][1] for n in numbers])
        bench.progress.update(numbers.stop, len(ids), force=True)
    await db.execute("DELETE FROM jobs WHERE tenant = $1", TEMPLATES_TENANT)


# A run's fate by its number, spread over the jobs and over time: 2 % dead, 1 % cancelled.
FATE = "CASE WHEN (n + n / 100) % 100 < 2 THEN 'dead' WHEN (n + n / 100) % 100 = 2 THEN 'cancelled' ELSE 'succeeded' END"


async def _copy_runs(bench: Bench, db: asyncpg.Connection, template: str, ids: list[str], runs: int) -> None:
    """Run n belongs to the first job when n is a multiple of HEAVY_EVERY, else to job n mod the
    count; run 1 is the newest, each next one older by the same step. One attempt each, as the
    list pages read the first attempt's start."""
    step = RUNS_OVER / runs
    # The jobs by their number, with what each run copies from its job; temporary, on this connection.
    await db.execute("CREATE TEMPORARY TABLE pick AS SELECT (u.o - 1)::bigint AS i, j.job_id, j.tenant, j.job_type, "
                     "j.shard_id, j.payload FROM unnest($1::text[]) WITH ORDINALITY AS u(job_id, o) JOIN jobs j USING (job_id)", ids)
    await db.execute("ALTER TABLE pick ADD PRIMARY KEY (i)")
    await db.execute("ANALYZE pick")

    def instant(newest: str, step: str, plus_ms: str = "0") -> str:
        return f"({newest}::timestamptz - n * {step}::interval + ({plus_ms}) * interval '1 millisecond')"

    ended = "(40 + n % 5000)"  # each run took 40 ms to 5 s
    run_overrides = {
        "run_id": "md5('console-' || n)::uuid::text", "job_id": "pick.job_id", "tenant": "pick.tenant",
        "job_type": "pick.job_type", "shard_id": "pick.shard_id", "payload": "pick.payload", "state": FATE, "attempts": "1",
        "last_error": f"CASE WHEN {FATE} = 'dead' THEN 'TimeoutError: the upstream did not answer within 30 s' END",
        **dict.fromkeys(("scheduled_for", "available_at", "created_at"), instant("$5", "$6")),
        "first_attempt_at": instant("$5", "$6", "2"),
        **dict.fromkeys(("updated_at", "finished_at"), instant("$5", "$6", ended)),
    }
    attempt_overrides = {
        "run_id": "md5('console-' || n)::uuid::text",
        "outcome": f"CASE {FATE} WHEN 'dead' THEN 'failed' WHEN 'cancelled' THEN 'cancelled' ELSE 'succeeded' END",
        "error_message": f"CASE WHEN {FATE} = 'dead' THEN 'the upstream did not answer within 30 s' END",
        "dispatched_at": instant("$4", "$5", "2"), "started_at": instant("$4", "$5", "3"),
        "finished_at": instant("$4", "$5", ended),
    }
    run_source = ("runs t CROSS JOIN generate_series($2::bigint, $3::bigint) AS n "
                  f"JOIN pick ON pick.i = CASE WHEN n % {HEAVY_EVERY} = 0 THEN 0 ELSE n % $4::bigint END "
                  "WHERE t.run_id = $1")
    attempt_source = "attempts t CROSS JOIN generate_series($2::bigint, $3::bigint) AS n WHERE t.run_id = $1"
    newest = now_utc() - timedelta(minutes=1)
    bench.progress.phase(f"copying {runs:,} runs and their attempts")
    started = time.monotonic()
    for first in range(1, runs + 1, RUN_BATCH):
        last = min(first + RUN_BATCH - 1, runs)
        async with db.transaction():
            await insert_copies(db, "runs", run_overrides, run_source, template, first, last, len(ids), newest, step)
            await insert_copies(db, "attempts", attempt_overrides, attempt_source, template, first, last, newest, step)
        bench.progress.update(last, runs, f"{last / (time.monotonic() - started):,.0f} runs/s", force=True)
    await db.execute("DROP TABLE pick")


# -- the node and its pages ------------------------------------------------------------------------


async def _client_token(url: str) -> str:
    store = open_store(url)
    try:
        _, secret = await issue_token(store, tenant=TENANT, role=Role.CLIENT, name="bench console")
    finally:
        await store.close()
    return str(secret)


async def _wait_for_console(http: aiohttp.ClientSession, base: str, node: Daemon) -> None:
    """The API answers before the console may: wait until /signin does."""
    deadline = Deadline(CONSOLE_START_S)
    while True:
        try:
            async with http.get(f"{base}/signin", allow_redirects=False) as response:
                await response.read()
                if response.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            pass
        if deadline.expired or (node.popen is not None and node.popen.poll() is not None):
            raise RuntimeError(f"the console at {base} did not answer GET /signin with 200\n{node.log_tail()}")
        await asyncio.sleep(0.2)


async def _sign_in(http: aiohttp.ClientSession, base: str, token: str, node: Daemon) -> str:
    """POST the token as the sign-in form does; the 303 answer sets the session cookie."""
    async with http.post(f"{base}/signin", data={"token": token}, allow_redirects=False) as response:
        await response.read()
        cookie = response.cookies.get(COOKIE)
        if response.status != 303 or cookie is None:
            raise RuntimeError(f"signing in answered {response.status} without a {COOKIE} cookie\n{node.log_tail()}")
    return f"{COOKIE}={cookie.value}"


class _NextPageLink(HTMLParser):
    """The href of the element whose id is ``next-page`` (attribute values come unescaped)."""

    def __init__(self) -> None:
        super().__init__()
        self.href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id") == "next-page" and values.get("href"):
            self.href = values["href"]


async def _pages(http: aiohttp.ClientSession, base: str, cookie: str, loaded: Loaded,
                 node: Daemon) -> list[tuple[str, str]]:
    """(label, URL) of each page measured; the second page of jobs is where /jobs links to."""
    _, body = await _get(http, f"{base}/jobs", cookie, node)
    finder = _NextPageLink()
    finder.feed(body.decode(errors="replace"))
    if finder.href is None:
        raise RuntimeError("GET /jobs has no link with id next-page: no second page to measure")
    paths = [
        ("overview", "/"),
        ("jobs", "/jobs"),
        ("jobs by name", f"/jobs?q={quote(loaded.heavy_name)}"),
        ("jobs by name prefix", f"/jobs?q={AREAS[0]}-"),
        ("jobs by id prefix", f"/jobs?q={loaded.heavy_job[:ID_PREFIX_LENGTH]}"),
        ("paused jobs", "/jobs?state=paused"),
        ("jobs, second page", urljoin(f"{base}/jobs", finder.href)),
        ("job with ~1 % of the runs", f"/jobs/{loaded.heavy_job}"),
        ("runs", "/runs"),
        ("dead runs", "/runs?state=dead"),
        ("lost runs (there are none)", "/runs?state=lost"),
        ("runs of that job", f"/runs?job={loaded.heavy_job}"),
        ("run", f"/runs/{loaded.run_id}"),
        ("cluster", "/cluster"),
        ("workflows", "/workflows"),
    ]
    return [(label, path if path.startswith("http") else f"{base}{path}") for label, path in paths]


async def _get(http: aiohttp.ClientSession, url: str, cookie: str, node: Daemon) -> tuple[float, bytes]:
    """GET ``url`` as the signed-in browser; the seconds from sending to the last byte, and the body.
    Anything but 200 (a redirect to /signin included) fails the run: a page that errs is not fast."""
    started = time.perf_counter()
    async with http.get(url, headers={"Cookie": cookie}, allow_redirects=False) as response:
        body = await response.read()
    elapsed = time.perf_counter() - started
    if response.status != 200:
        shown = re.sub(r"\s+", " ", body.decode(errors="replace"))[:300]
        raise RuntimeError(f"GET {_path(url)} answered {response.status}: {shown}\n{node.log_tail()}")
    return elapsed, body


def _path(url: str) -> str:
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


async def _measure(bench: Bench, http: aiohttp.ClientSession, cookie: str, pages: list[tuple[str, str]],
                   node: Daemon) -> list[dict[str, object]]:
    times: dict[str, list[float]] = {url: [] for _, url in pages}
    sizes: dict[str, int] = {}
    bench.progress.phase(f"fetching {len(pages)} pages, {WARMUPS} + {REQUESTS} times each")
    total = len(pages) * (WARMUPS + REQUESTS)
    done = 0
    for round_ in range(WARMUPS + REQUESTS):
        for _, url in pages:
            elapsed, body = await _get(http, url, cookie, node)
            if round_ >= WARMUPS:
                times[url].append(elapsed * 1000)
            sizes[url] = len(body)
            done += 1
            bench.progress.update(done, total)
    bench.progress.end()
    results = []
    for label, url in pages:
        figures = percentiles(times[url])
        results.append({"page": label, "path": _path(url), "bytes": sizes[url],
                        "ms": {key: figures[key] for key in ("p50", "p95", "max")}})
    return results
