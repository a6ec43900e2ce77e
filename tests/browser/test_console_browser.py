"""The console in a real browser: headless Chromium against a real node and a real worker process.

Sign in, create a job, watch its runs appear without a reload, pause and resume it, retry a dead
run; a viewer cannot act, another tenant's job is invisible. The screenshots in the README are
taken here (``make screenshots``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from browser_support import ConsoleNode
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from fastlane.client import Client

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

WAIT = 30.0
T = TypeVar("T")


def eventually(browser: webdriver.Chrome, what: str, probe: Callable[[], T | None], timeout: float = WAIT) -> T:
    """Selenium's own wait on ``probe`` until it returns something truthy, with a deadline (elements
    go stale as live regions refresh: those are looked up again)."""
    wait = WebDriverWait(browser, timeout, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException))
    found: T = wait.until(lambda _: probe(), message=f"timed out waiting for {what}")
    return found


def sign_in(browser: webdriver.Chrome, node: ConsoleNode, who: str) -> None:
    browser.delete_all_cookies()
    browser.get(node.url + "/")
    assert browser.current_url.endswith("/signin"), browser.current_url
    browser.find_element(By.ID, "token").send_keys(node.secrets[who])
    browser.find_element(By.ID, "signin").click()
    eventually(browser, f"{who} signed in", lambda: browser.find_elements(By.ID, "signout"))


def fill(browser: webdriver.Chrome, fields: dict[str, str]) -> None:
    for name, value in fields.items():
        element = browser.find_element(By.ID, name)
        if element.tag_name == "select":
            Select(element).select_by_value(value)
        else:
            element.clear()
            element.send_keys(value)


def screenshot(browser: webdriver.Chrome, path: Path) -> None:
    """The whole page, not only the window: the window grows to the page's height for the picture."""
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1360, min(max(int(height), 900), 2400))
    browser.save_screenshot(str(path))
    browser.set_window_size(1360, 900)


def run_states(browser: webdriver.Chrome, table_id: str) -> list[str]:
    rows = browser.find_elements(By.CSS_SELECTOR, f"#{table_id} tr[data-state]")
    return [row.get_attribute("data-state") or "" for row in rows]


def test_a_user_steers_jobs_and_runs_from_the_browser(console_node: ConsoleNode, chromium: webdriver.Chrome,
                                                      screenshots: Path):
    node, browser = console_node, chromium
    sign_in(browser, node, "alice")

    # Create a job every two seconds from the form; its page shows the schedule and DST-aware fire times.
    browser.find_element(By.LINK_TEXT, "Jobs").click()
    browser.find_element(By.ID, "new-job").click()
    fill(browser, {"name": "billing-close", "job_type": "console.ok", "schedule": "cron",
                   "cron": "*/2 * * * * *", "timezone": "America/New_York", "payload": '{"ledger": "eu"}'})
    browser.find_element(By.ID, "save").click()
    eventually(browser, "the job page", lambda: "billing-close" in browser.find_element(By.TAG_NAME, "h1").text)
    assert browser.find_element(By.ID, "note").text == "Job created."
    fire_times = browser.find_element(By.ID, "fire-times").text
    assert "AMERICA/NEW_YORK" in fire_times and re.search(r"\d\d:\d\d:\d\d E[SD]T", fire_times), fire_times
    job_url = browser.current_url.split("?")[0]

    # Runs appear and succeed while the page stays loaded: the live region refreshes itself.
    browser.execute_script("window.notReloaded = true;")
    eventually(browser, "three succeeded runs, live", lambda: run_states(browser, "job-runs").count("succeeded") >= 3)
    assert browser.execute_script("return window.notReloaded === true;")
    screenshot(browser, screenshots / "job.png")

    # Pause, then resume.
    browser.find_element(By.ID, "pause").click()
    eventually(browser, "paused", lambda: browser.find_element(By.ID, "job-state").text == "paused")
    browser.find_element(By.ID, "resume").click()
    eventually(browser, "active again", lambda: browser.find_element(By.ID, "job-state").text == "active")

    # A job whose handler always raises: its run dies, and is retried from the runs page.
    browser.get(node.url + "/jobs/new")
    fill(browser, {"name": "charge-card", "job_type": "console.fail", "schedule": "now", "max_attempts": "1"})
    browser.find_element(By.ID, "save").click()
    eventually(browser, "the failing job's page", lambda: "charge-card" in browser.find_element(By.TAG_NAME, "h1").text)
    eventually(browser, "its run dead", lambda: "dead" in run_states(browser, "job-runs"))
    browser.get(node.url + "/runs?state=dead")
    dead = eventually(browser, "the dead run listed", lambda: browser.find_elements(By.CSS_SELECTOR, "#runs tr[data-state=dead]"))
    assert len(dead) == 1
    dead[0].find_element(By.CSS_SELECTOR, "button.retry").click()
    eventually(browser, "the run page after retry", lambda: browser.find_element(By.ID, "note").text.startswith("The run will"))
    eventually(browser, "a second attempt, with its traceback",
               lambda: len(browser.find_elements(By.CSS_SELECTOR, "#attempts tr.traceback")) == 2)
    assert "card declined" in browser.find_element(By.ID, "attempts").text
    eventually(browser, "dead again", lambda: browser.find_element(By.ID, "run-state").text == "dead")
    browser.find_elements(By.CSS_SELECTOR, "#attempts details")[-1].click()  # open the last traceback
    screenshot(browser, screenshots / "run.png")

    browser.get(node.url + "/jobs")
    screenshot(browser, screenshots / "jobs.png")
    browser.get(node.url + "/")
    eventually(browser, "the overview's chart", lambda: browser.find_elements(By.CSS_SELECTOR, "svg.chart"))
    screenshot(browser, screenshots / "overview.png")

    # A viewer sees the job but is offered no action, and a forged action is refused.
    sign_in(browser, node, "victor")
    browser.get(job_url)
    assert "billing-close" in browser.find_element(By.TAG_NAME, "h1").text
    assert not browser.find_elements(By.ID, "pause") and not browser.find_elements(By.ID, "delete")
    status = browser.execute_script("""
        const csrf = document.querySelector("input[name=csrf]").value;
        const answer = await fetch(location.pathname + "/pause", {method: "POST",
            body: new URLSearchParams({csrf}), redirect: "manual"});
        return answer.status;""")
    assert status == 403
    browser.get(job_url)
    assert browser.find_element(By.ID, "job-state").text == "active"

    # Another tenant finds nothing of acme's.
    sign_in(browser, node, "olga")
    browser.get(node.url + "/jobs")
    assert "billing-close" not in browser.find_element(By.ID, "jobs").text
    browser.get(job_url)
    assert "not found" in browser.find_element(By.ID, "error").text.lower()
    browser.get(node.url + "/cluster")
    screenshot(browser, screenshots / "cluster-other-tenant.png")
    assert "acme" not in browser.find_element(By.ID, "workers").text  # acme's worker is not shown to others


async def test_a_user_starts_a_workflow_and_follows_its_graph_and_timeline(console_node: ConsoleNode,
                                                                          chromium: webdriver.Chrome, screenshots: Path):
    node, browser = console_node, chromium
    definition = {"name": "month-end", "steps": [
        {"name": "close-ledger", "job_type": "console.ok"},
        {"name": "invoice", "job_type": "console.ok", "after": ["close-ledger"]},
        {"name": "report", "job_type": "console.ok", "after": ["close-ledger"]},
        {"name": "archive", "job_type": "console.ok", "after": ["invoice", "report"]},
    ]}
    async with Client(node.api, token=node.secrets["alice"]) as client:
        await client.create_workflow(definition)
    sign_in(browser, node, "alice")
    browser.get(node.url + "/workflow?name=month-end")
    browser.find_element(By.ID, "trigger-workflow").click()
    eventually(browser, "the new workflow run's page",
               lambda: browser.find_element(By.ID, "note").text == "A run of the workflow was started.")
    eventually(browser, "every step succeeded, live", lambda: len(browser.find_elements(
        By.CSS_SELECTOR, "#dag g.step.succeeded")) == 4)
    steps = [box.get_attribute("data-step") for box in browser.find_elements(By.CSS_SELECTOR, "#dag g.step")]
    assert steps == ["close-ledger", "invoice", "report", "archive"]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#dag line.edge")) == 4
    eventually(browser, "the timeline", lambda: len(browser.find_elements(By.CSS_SELECTOR, "#timeline .timeline-row")) == 4)
    screenshot(browser, screenshots / "workflow-run.png")
