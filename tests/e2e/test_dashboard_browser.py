"""The dashboard in a real headless Chromium (Debian's `chromium`, driven by Playwright) against a running head with
two agents, over HTTPS with the head's certificate (Chromium trusts that certificate's key, as a user who checked it
would): without the API token it shows nothing; signed in, the fleet appears, a job shows up and finishes live (no
reload), the job page shows where its shards ran and what they spent, and the user cancels a job, reads a job's log
with what its shards printed, opens a node's page (its CPU split into its owner's share and Farm's, perf/W per model
on it), and sees memory charted, Farm's and the owners' CPU charted apart, no GPU-memory chart on a fleet without
GPUs, and perf/W per model.

FARM_SCREENSHOT=docs/dashboard.png makes the run save the fleet page, with the finished job, there;
FARM_SCREENSHOT_JOB=docs/dashboard-job.png the job page with its log; FARM_SCREENSHOT_NODE=docs/dashboard-node.png
a node's page.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from farm.local import read_json
from tests.conftest import FIXTURES, ROOT, Cluster

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)"),
]
WAIT_MS = 180_000  # a job on a busy two-core machine; every wait below ends as soon as its condition holds


@pytest.fixture()
def dashboard(cluster: Cluster) -> str:
    info = read_json(cluster.state_dir / "head.json") or {}
    assert str(info.get("dashboard", "")).startswith("https://127.0.0.1:"), info
    return str(info["dashboard"])


def head_certificate_key(cluster: Cluster) -> str:
    """The base64 SHA-256 of the head's server certificate's public key (Chromium's --ignore-certificate-errors-spki-
    list: that key's certificate is accepted, no other)."""
    certificate = x509.load_pem_x509_certificate((cluster.state_dir / "tls" / "head.pem").read_bytes())
    spki = certificate.public_key().public_bytes(serialization.Encoding.DER,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


@dataclass
class Browser:
    page: Any  # playwright.sync_api.Page
    elsewhere: list[str]  # requests for anything not served by the head: the page must need none
    errors: list[str]  # uncaught script errors


@pytest.fixture()
def browser(cluster: Cluster, dashboard: str) -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # --no-sandbox: Chromium's sandbox refuses to run as root, which is how CI runs.
        trust = f"--ignore-certificate-errors-spki-list={head_certificate_key(cluster)}"
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", trust])
        # bypass_csp: the page's policy forbids eval, which Playwright's wait_for_function needs for its predicates.
        page = chromium.new_page(viewport={"width": 1400, "height": 1000}, bypass_csp=True)
        page.set_default_timeout(WAIT_MS)
        opened = Browser(page, [], [])
        page.on("request", lambda r: None if r.url.startswith((dashboard, "data:")) else opened.elsewhere.append(r.url))
        page.on("pageerror", lambda error: opened.errors.append(str(error)))
        yield opened
        chromium.close()


def api(cluster: Cluster, path: str) -> Any:
    status, body = cluster.dashboard_call(path)
    assert status == 200, (path, status, body)
    return body


def sign_in(page: Any, token: str) -> None:
    page.locator("#signin-open").click()
    page.locator("#token-input").fill(token)
    page.locator("#signin-submit").click()
    page.locator("#signout").wait_for()


def submit(cluster: Cluster, work: Path, name: str, model: str, shards: int, batch_size: int) -> str:
    spec = work / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({"name": name, "model": model, "dataset": "numbers.npz", "shards": shards,
                                    "batch_size": batch_size, "output": str(work / "out" / name)}))
    result = cluster.farm("submit", str(spec), "--workdir", str(work))
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    """A job's working directory: the toy job code and 32 rows of numbers."""
    shutil.copy(FIXTURES / "jobs" / "toyjob.py", tmp_path / "toyjob.py")
    np.savez(tmp_path / "numbers.npz", x=np.arange(64, dtype=np.float32).reshape(32, 2))
    return tmp_path


def test_the_fleet_and_a_job_appear_and_change_live(cluster: Cluster, dashboard: str, browser: Browser,
                                                   work: Path) -> None:
    page = browser.page
    page.goto(dashboard)
    page.locator("#locked").wait_for()  # without the API token, the head shows nothing of its fleet
    assert page.locator("tr[data-node]").count() == 0
    sign_in(page, cluster.head.api_token)
    fleet = {n["name"]: n for n in api(cluster, "api/fleet")["nodes"]}
    for name in ("agent-a", "agent-b"):
        row = page.locator(f"tr[data-node='{name}']")
        row.wait_for()
        assert row.locator(".node-state").inner_text() == "ready"
        assert " W" in row.locator(".node-power").inner_text()
        # CPU power here is Farm's model estimate (no RAPL) or a counter: the badge says which.
        assert (row.locator(".node-power .est").count() == 1) is fleet[name]["power_estimate"]
    page.wait_for_function("Number(document.getElementById('live').dataset.ticks || 0) >= 1")
    page.evaluate("window.sameDocument = true")  # gone if the page reloads
    items_before = page.evaluate(ITEMS_DONE)
    # Record every state the job's row shows, as the live view redraws it.
    # Also what the page said while it ran: its rate and time left.
    page.evaluate(r"""() => { window.seen = []; window.running = new Set(); new MutationObserver(() => {
        for (const row of document.querySelectorAll('tr[data-job]'))
            window.seen.push(row.dataset.job + ':' + row.dataset.state);
        for (const eta of document.querySelectorAll('tr[data-job] .job-eta'))
            if (/items\/s · (about .* left|finishing)/.test(eta.textContent))
                window.running.add('eta:' + eta.closest('tr').dataset.job); })
        .observe(document.getElementById('view'), {childList: true, subtree: true}); }""")

    # ≈ 4 s a shard (8 batches of one row at 0.5 s), ~8 s in all: long enough for the page's 2 s ticks to show it
    # running with a rate and a time left (at 1 s a shard the job could end between two ticks).
    job_id = submit(cluster, work, "slow-toy", "toyjob:slow", shards=4, batch_size=1)
    row = page.locator(f"tr[data-job='{job_id}']")
    row.wait_for()
    page.wait_for_function(f"document.querySelector(\"tr[data-job='{job_id}']\").dataset.state === 'succeeded'")
    seen = [s.split(":")[1] for s in page.evaluate("window.seen") if s.startswith(job_id + ":")]
    assert seen[0] in ("queued", "running") and seen[-1] == "succeeded", seen  # it changed before our eyes
    running = page.evaluate("[...window.running]")
    assert f"eta:{job_id}" in running
    assert "32/32 items" in row.locator(".job-progress").inner_text()
    page.wait_for_function(f"({ITEMS_DONE})() >= {items_before + 32}")  # the nodes' counts followed
    assert page.evaluate("window.sameDocument") is True
    points = page.locator("#chart-farm-cpu .uplot").get_attribute("data-points")
    assert points is not None and int(points) >= 2
    assert page.locator("#chart-owner-cpu .u-legend").inner_text().lower().count("agent-") == 2
    assert page.locator("#chart-power .u-legend").inner_text().lower().count("agent-") == 2
    markers = page.locator("#chart-power .u-legend .u-series .u-marker").evaluate_all(
        "els => els.map(e => getComputedStyle(e).borderColor)")
    # Each node its own colour, from Okabe and Ito's palette (colour-blind readers tell them apart too).
    assert set(markers[1:]) == {"rgb(0, 114, 178)", "rgb(230, 159, 0)"}, markers

    if os.environ.get("FARM_SCREENSHOT"):
        page.screenshot(path=str(ROOT / os.environ["FARM_SCREENSHOT"]), full_page=True)

    row.locator("a").click()
    page.locator("#job-page").wait_for()
    job = api(cluster, f"api/jobs/{job_id}")
    shown = page.locator("#shards tbody tr")
    assert shown.count() == 4
    for index, shard in enumerate(job["shards_detail"]):
        cells = shown.nth(index)
        assert cells.locator(".shard-node").inner_text() == shard["node_name"] != ""
        assert cells.locator(".shard-device").inner_text() == f"{shard['device']} ({shard['backend']})"
        # An estimated energy figure says so; a counter's stands alone.
        assert (cells.locator(".shard-energy .est").count() == 1) is shard["energy_estimate"]
        # Of its measured seconds, the share it waited for input, as its node reported it (an inference shard's)
        waited = cells.locator(".shard-input")
        assert shard["input_wait_s"] is not None
        assert waited.inner_text() == f"{100 * shard['input_wait_s'] / shard['seconds']:.0f}%"
        assert waited.get_attribute("title") == f"before its measured time: {shard['before']}"
    assert {s["node_name"] for s in job["shards_detail"]} <= {"agent-a", "agent-b"}
    assert page.locator("#explanation").inner_text().strip() == job["explanation"].strip() != ""
    assert page.locator("#cancel-job").count() == 0  # a finished job has nothing to cancel
    assert browser.elsewhere == [] and browser.errors == []


def test_cancelling_from_the_page_needs_the_api_token(cluster: Cluster, dashboard: str, browser: Browser,
                                                      work: Path) -> None:
    page = browser.page
    job_id = submit(cluster, work, "slower-toy", "toyjob:slow", shards=2, batch_size=1)  # 16 × 0.5 s a shard
    page.goto(f"{dashboard}#/jobs/{job_id}")
    page.locator("#locked").wait_for()  # without the token: not even the job, let alone its cancel button
    assert page.locator("#cancel-job").count() == 0

    page.locator("#signin-open").click()
    page.locator("#token-input").fill("not-the-token")
    page.locator("#signin-submit").click()
    page.wait_for_function("document.getElementById('signin-error').textContent !== ''")
    page.locator("#token-input").fill(cluster.head.api_token)
    page.locator("#signin-submit").click()
    page.locator("#signout").wait_for()

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#cancel-job:not([disabled])").click()
    page.wait_for_function("document.querySelector('#job-page .meta .state').textContent === 'cancelled'")
    assert api(cluster, f"api/jobs/{job_id}")["state"] == "cancelled"
    assert browser.errors == []


def test_a_jobs_log_a_node_page_memory_and_perf_per_model(cluster: Cluster, dashboard: str, browser: Browser,
                                                          work: Path) -> None:
    page = browser.page
    job_id = submit(cluster, work, "chatty-toy", "toyjob:chatty", shards=2, batch_size=8)
    page.goto(f"{dashboard}#/jobs/{job_id}")
    page.locator("#locked").wait_for()  # the job's page, and its output, are for holders of the token
    assert page.locator("#job-log").count() == 0
    sign_in(page, cluster.head.api_token)
    page.locator("#job-page").wait_for()
    page.wait_for_function("document.querySelector('#job-page .meta .state').textContent === 'succeeded'")
    # What each shard printed on its node, under its index, with the job's own events.
    page.wait_for_function("[...document.querySelectorAll('#job-log .log-output')].length >= 2")
    log = page.locator("#job-log").inner_text()
    assert "accepted: 32 items in 2 shards" in log and "job succeeded" in log
    assert "[shard 1] batch of 8 starting at 32" in log and "a warning on stderr" in log
    assert f"farm results {job_id}" in page.locator("#job-results").inner_text()
    if os.environ.get("FARM_SCREENSHOT_JOB"):
        page.screenshot(path=str(ROOT / os.environ["FARM_SCREENSHOT_JOB"]), full_page=True)

    page.goto(dashboard)
    # Each node's CPU, split into its owner's share and Farm's, as the head has them.
    fleet = {n["name"]: n for n in api(cluster, "api/fleet")["nodes"]}
    cpu = page.locator("tr[data-node='agent-a'] .node-cpu")
    assert cpu.locator(".owner-share").inner_text().startswith("owner ")
    assert cpu.locator(".farm-share").inner_text().startswith("Farm ")
    assert 0 <= fleet["agent-a"]["farm_cpu_percent"] <= fleet["agent-a"]["cpu_percent"]
    assert fleet["agent-a"]["owner_cpu_percent"] == pytest.approx(
        fleet["agent-a"]["cpu_percent"] - fleet["agent-a"]["farm_cpu_percent"])
    assert "Perf/W (items/J)" not in page.locator("#nodes th").all_text_contents()  # a node's would mix models
    ran = api(cluster, f"api/jobs/{job_id}")["shards_detail"][0]["node_name"]  # a node that ran the chatty job
    page.locator(f"tr[data-node='{ran}'] a").click()
    page.locator(f"#node-page[data-node='{ran}']").wait_for()
    assert page.locator("#node-backends tr[data-backend='cpu']").count() == 1
    assert "cores" in page.locator("#node-page .meta").inner_text()
    assert page.locator("#node-page .meta .cpu-split .farm-share").count() == 1
    assert page.locator("#node-gpu-memory").count() == 0  # no GPU here: no GPU memory, not a zero
    chatty = page.locator("#node-models tr[data-model='toyjob:chatty'][data-backend='cpu']")
    chatty.wait_for()  # its own perf/W for that model
    assert "-" != chatty.locator(".model-perf").inner_text()
    # The node's own charts, from what the head sampled of it: its CPU (Farm's, the owner's) and its power, lines in
    # Okabe and Ito's palette (uPlot draws on a canvas: the legend's markers carry the colours).
    page.wait_for_function("document.querySelector('#node-chart-power .uplot') !== null")
    legend = page.locator("#node-chart-cpu .u-legend").inner_text().lower()
    assert "farm" in legend and legend.count("owner") == 1
    markers = page.locator("#node-chart-cpu .u-legend .u-marker").evaluate_all(
        "all => all.map(m => getComputedStyle(m).borderColor)")
    assert "rgb(0, 114, 178)" in markers, markers  # Okabe-Ito's blue: the first line
    assert int(page.locator("#node-chart-cpu .uplot").get_attribute("data-points") or 0) >= 1
    if os.environ.get("FARM_SCREENSHOT_NODE"):
        page.screenshot(path=str(ROOT / os.environ["FARM_SCREENSHOT_NODE"]), full_page=True)

    page.locator("a[href='#/']").first.click()
    page.locator("#fleet-page").wait_for()
    page.wait_for_function("document.querySelector('#chart-memory .uplot') !== null")
    assert page.locator("#chart-memory .u-legend").inner_text().lower().count("agent-") == 2
    # GPU memory is charted where NVML reports it: on this fleet of CPUs the chart is absent, not a line at zero.
    assert page.locator("#chart-gpu-memory").is_hidden() and page.locator("#chart-gpu-memory .uplot").count() == 0
    model = page.locator("#models tr[data-model='toyjob:chatty'][data-backend='cpu']")
    model.wait_for()
    assert "-" != model.locator(".model-perf").inner_text()
    assert page.locator("#total-perf").count() == 0  # no items/J across models
    assert browser.elsewhere == [] and browser.errors == []


ITEMS_DONE = """() => [...document.querySelectorAll('tr[data-node] .node-items')]
    .reduce((sum, cell) => sum + Number(cell.textContent.replace(/,/g, '')), 0)"""
