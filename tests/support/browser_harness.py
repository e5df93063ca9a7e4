"""Headless Chromium for the browser tests (tests/client/test_browser.py, tests/client/test_lab_statusbar.py,
tests/hub/test_dashboard.py and the dashboard checks of other hub tests): Debian's chromium through
Playwright, a page logged in to a hub, the dashboard page; screenshots go to test-artifacts/."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from shared_hub import PASSWORD

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"


@contextlib.contextmanager
def chromium():
    """Headless Debian Chromium through Playwright (skips the test when it is not installed)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (run `make browser-deps` or apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


def login(browser, hub, user: str):
    """A new page logged in to the hub as ``user`` (the dummy authenticator; the shared hub sets
    its password, shared_hub.PASSWORD), at 1280x800."""
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(hub.hub_url + "hub/login")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", PASSWORD)
    page.click("#login_submit")
    return page


def open_dashboard(browser, hub, user: str):
    page = login(browser, hub, user)
    page.goto(hub.hub_url + "services/gpupool/")  # JupyterHub OAuth, then the page
    try:
        page.wait_for_selector("#queues-chart", timeout=30_000)
    except Exception:
        raise AssertionError(f"{user}: no dashboard at {page.url}:\n{page.content()[:3000]}\n"
                             f"{hub.service_log()[-3000:]}") from None
    page.wait_for_function("() => ['queues-chart', 'timeline-chart'].every("
                           "id => Chart.getChart(document.getElementById(id)) !== undefined)", timeout=10_000)
    return page


def wait_for_text(page, text: str, timeout: float = 30_000):
    """Wait until the page's body shows ``text``. Through a locator, so a page that is navigating (after
    a form's submit, the body is briefly absent) is waited out, not read half-built."""
    from playwright.sync_api import expect

    expect(page.locator("body")).to_contain_text(text, timeout=timeout)
