"""Seeded random and boundary input for every console form and filter: never a 500, never a dead node.

The console's job form, its actions, its bulk actions and the filters of its lists take text from the browser: each
value is drawn from the suite's boundary strings (empty, 201 characters, 64 KiB, NUL and control
characters, RTL marks, emoji, SQL and path noise) or random Unicode, and posted or put in a query
string of a real node's console, on both backends. Every answer must be a page (200, a redirect, or
a 4xx naming the problem), and the node must still serve pages and API calls at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
from collections import Counter
from urllib.parse import quote

import aiohttp
import pytest
from strategies import ENUM_NOISE, PAGE_TOKEN_EDGES, STRING_EDGES

from fastlane.client import Client
from fastlane.domain.models import JobState, RunState
from fastlane.server.node import Node
from fastlane.server.settings import Settings
from fastlane.testing.processes import free_port

pytestmark = [pytest.mark.fuzz, pytest.mark.e2e, pytest.mark.timeout(300)]

REQUESTS = 400
SEED = 20261125
FORM_FIELDS = ("name", "job_type", "schedule", "cron", "timezone", "at", "every_seconds", "payload",
               "max_attempts", "priority")
SCHEDULE_VALUES = ("now", "at", "cron", "interval", "", "CRON", "weekly")
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def _text(rng: random.Random) -> str:
    if rng.random() < 0.6:
        return rng.choice(STRING_EDGES)
    return "".join(chr(rng.choice((rng.randint(0x20, 0x7e), rng.randint(0xa0, 0xd7ff), rng.randint(0xe000, 0x10ffff))))
                   for _ in range(rng.randint(0, 40)))


def _form(rng: random.Random, csrf: str) -> dict[str, str]:
    form = {"csrf": csrf, "name": f"fuzz-{rng.randint(0, 10**6)}", "job_type": "fuzz", "schedule": "interval",
            "every_seconds": "3600"}
    for field in rng.sample(FORM_FIELDS, rng.randint(1, 4)):
        form[field] = rng.choice(SCHEDULE_VALUES) if field == "schedule" and rng.random() < 0.5 else _text(rng)
    return form


def _query(rng: random.Random) -> str:
    page = rng.choice(("/jobs", "/runs", "/workflows", "/workflow"))
    values = {
        "/jobs": {"q": _text, "state": lambda r: r.choice((*JobState, *ENUM_NOISE)) if r.random() < 0.5 else _text(r),
                  "type": _text, "page": lambda r: r.choice(PAGE_TOKEN_EDGES)},
        "/runs": {"state": lambda r: r.choice((*RunState, *ENUM_NOISE)) if r.random() < 0.5 else _text(r), "job": _text,
                  "page": lambda r: r.choice(PAGE_TOKEN_EDGES)},
        "/workflows": {"page": lambda r: r.choice(PAGE_TOKEN_EDGES)},
        "/workflow": {"name": _text, "page": lambda r: r.choice(PAGE_TOKEN_EDGES)},
    }[page]
    chosen = rng.sample(sorted(values), rng.randint(1, len(values)))
    return page + "?" + "&".join(f"{key}={quote(values[key](rng), safe='')}" for key in chosen)


async def test_console_forms_and_filters_answer_bad_input_with_a_page(fuzz_backend: tuple[str, str]):
    _, url = fuzz_backend
    node = Node(Settings(db_url=url, listen=f"127.0.0.1:{free_port()}", node_id="fuzz-console", shard_count=4,
                        console_listen="127.0.0.1:0"))
    running = asyncio.create_task(node.run())
    rng = random.Random(SEED)
    statuses: Counter[int] = Counter()
    try:
        async with asyncio.timeout(30):
            await node.ready.wait()
        base = (node.console_url or "").rstrip("/")
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True),
                                         timeout=aiohttp.ClientTimeout(total=20)) as browser:
            async with browser.get(base + "/jobs/new") as answer:
                found = CSRF.search(await answer.text())
            assert found is not None
            csrf = found.group(1)
            job_ids = ["00000000-0000-0000-0000-000000000000"]
            for _ in range(REQUESTS):
                kind = rng.random()
                if kind < 0.4:
                    target = base + "/jobs/new" if rng.random() < 0.7 else f"{base}/jobs/{rng.choice(job_ids)}/edit"
                    request = browser.post(target, data=_form(rng, csrf), allow_redirects=False)
                elif kind < 0.55:
                    action = rng.choice(("pause", "resume", "trigger", "delete", "cancel", "retry", _text(rng)))
                    target_id = rng.choice(job_ids) if rng.random() < 0.5 else _text(rng)
                    path = f"/jobs/{quote(target_id, safe='')}/{quote(action, safe='')}"
                    request = browser.post(base + path, data={"csrf": csrf}, allow_redirects=False)
                elif kind < 0.62:  # a bulk action's filter, counted (and now and then confirmed)
                    items = rng.choice(("jobs", "runs"))
                    action = rng.choice(("pause", "resume", "delete", "cancel", "retry", _text(rng)))
                    fields = {key: _text(rng) if rng.random() < 0.7 else rng.choice((*JobState, *RunState))
                              for key in rng.sample(("state", "type", "job"), rng.randint(0, 3))}
                    fields |= {"csrf": csrf, "confirm": "1" if rng.random() < 0.2 else ""}
                    request = browser.post(f"{base}/{items}/bulk/{quote(action, safe='')}", data=fields,
                                           allow_redirects=False)
                else:
                    request = browser.get(base + _query(rng), allow_redirects=False)
                async with request as answer:
                    await answer.read()
                    statuses[answer.status] += 1
                    assert answer.status < 500, (answer.method, answer.url, answer.status)
                    location = answer.headers.get("Location", "")
                    if location.startswith("/jobs/") and "done=created" in location:
                        job_ids.append(location.split("/")[2].split("?")[0])
            async with browser.get(base + "/jobs") as answer:
                assert answer.status == 200
        async with Client(node_address(node)) as client:
            assert (await client.list_jobs()).items is not None
        assert statuses[303] > 0 and statuses[400] > 0, statuses  # both accepted and refused input were drawn
    finally:
        node.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 20)


def node_address(node: Node) -> str:
    return node.settings.listen
