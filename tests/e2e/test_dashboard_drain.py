"""The dashboard's Drain/Undrain button in a real headless Chromium: nothing shown without the API token, and with it a
click drains the node (the head's record says so) and the next one undrains it."""

from __future__ import annotations

from typing import Any

import pytest

from farm.client import Client
from tests.conftest import Cluster
from tests.e2e.test_dashboard_browser import (  # noqa: F401 (fixtures)
    CHROMIUM, Browser, api, browser, dashboard, sign_in,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)"),
]


def fleet_node(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict(next(n for n in api(cluster, "api/fleet")["nodes"] if n["name"] == name))


def test_the_drain_button_needs_the_api_token_and_drains_the_node(cluster: Cluster, dashboard: str,  # noqa: F811
                                                                   browser: Browser) -> None:  # noqa: F811
    page = browser.page
    page.goto(dashboard)
    page.locator("#locked").wait_for()  # without the token, no node and no button
    assert page.locator(".node-drain").count() == 0

    sign_in(page, cluster.head.api_token)
    try:
        page.once("dialog", lambda dialog: dialog.accept())
        page.locator("tr[data-node='agent-b'] .node-drain[data-action='drain']:not([disabled])").click()
        page.locator("tr[data-node='agent-b'] .node-drain[data-action='undrain']").wait_for()
        assert fleet_node(cluster, "agent-b")["drain"] is True

        page.locator("tr[data-node='agent-b'] .node-drain[data-action='undrain']").click()
        page.locator("tr[data-node='agent-b'] .node-drain[data-action='drain']").wait_for()
        assert fleet_node(cluster, "agent-b")["drain"] is False
        assert browser.errors == []
    finally:
        with Client(cluster.head) as client:
            client.drain_node("agent-b", False)
