"""The dashboard's Drain/Undrain button in a real headless Chromium: read-only without the API token, and with it a
click drains the node (the head's record says so) and the next one undrains it."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from farm.client import Client
from tests.conftest import Cluster
from tests.e2e.test_dashboard_browser import CHROMIUM, Browser, browser, dashboard  # noqa: F401 (fixtures)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)"),
]


def fleet_node(dashboard: str, name: str) -> dict[str, Any]:
    with urllib.request.urlopen(dashboard + "api/fleet", timeout=30) as response:
        return next(n for n in json.loads(response.read())["nodes"] if n["name"] == name)


def test_the_drain_button_needs_the_api_token_and_drains_the_node(cluster: Cluster, dashboard: str,  # noqa: F811
                                                                   browser: Browser) -> None:  # noqa: F811
    page = browser.page
    page.goto(dashboard)
    button = page.locator("tr[data-node='agent-b'] .node-drain")
    button.wait_for()
    assert button.is_disabled() and button.inner_text() == "Drain"  # read-only without the token

    page.locator("#signin-open").click()
    page.locator("#token-input").fill(cluster.head.api_token)
    page.locator("#signin-submit").click()
    page.locator("#signout").wait_for()
    try:
        page.once("dialog", lambda dialog: dialog.accept())
        page.locator("tr[data-node='agent-b'] .node-drain[data-action='drain']:not([disabled])").click()
        page.locator("tr[data-node='agent-b'] .node-drain[data-action='undrain']").wait_for()
        assert fleet_node(dashboard, "agent-b")["drain"] is True

        page.locator("tr[data-node='agent-b'] .node-drain[data-action='undrain']").click()
        page.locator("tr[data-node='agent-b'] .node-drain[data-action='drain']").wait_for()
        assert fleet_node(dashboard, "agent-b")["drain"] is False
        assert browser.errors == []
    finally:
        with Client(cluster.head) as client:
            client.drain_node("agent-b", False)
