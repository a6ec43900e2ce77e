"""Headless Chromium for the console's browser tests: the distribution's Chromium and ChromeDriver.

``scripts/ensure_tools.sh`` installs both (Debian's chromium and chromium-driver) when the suite is
set up, so nothing is downloaded when a test runs; Selenium is told where they are, so its own
driver manager never looks on the network either.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = os.environ.get("FASTLANE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("FASTLANE_CHROMEDRIVER", "/usr/bin/chromedriver")
# Where the tests leave their screenshots: the README's pictures are made with
# FASTLANE_SCREENSHOTS=docs/console (make screenshots); otherwise a temporary directory.
SCREENSHOTS_ENV = "FASTLANE_SCREENSHOTS"


@dataclass
class ConsoleNode:
    """A running node's console address, and the secret of each token made for the test."""

    url: str
    secrets: dict[str, str] = field(default_factory=dict)
    api: str = ""  # the node's gRPC address, for what the console cannot do (define a workflow)


def missing() -> str | None:
    """What is missing to run a browser, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            return f"{path} is missing: run `make tools` (Debian's chromium and chromium-driver)"
    return None


def start_chromium(profile: Path) -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1360,900", "--force-device-scale-factor=1", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    return driver
