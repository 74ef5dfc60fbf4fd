"""Driving Debian's Chromium through its chromedriver (selenium, no browser download) for the console tests."""

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOTS = Path(__file__).resolve().parents[1] / "build" / "ui-screenshots"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,800")  # fmt: skip


def chromium_or_skip() -> Any:
    """A headless Chromium under selenium, or a skip that says what is missing."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the dev extra)")
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            pytest.skip(f"{path} is missing: apt-get install -y chromium chromium-driver (.ci/run does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={tempfile.mkdtemp(prefix='llmgw-chromium-')}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console errors, for failures
    from selenium.webdriver.chrome.service import Service

    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_window_size(1280, 800)
    return driver


def wait_for(condition: Callable[[], Any], timeout: float = 15.0, what: str = "a condition") -> Any:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as error:  # the page is still rendering
            last = error
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}" + (f" ({last})" if last else ""))


def screenshot(driver: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path
