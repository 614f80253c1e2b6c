"""The dashboard's HTTP API, live events and /metrics, served by the real aiohttp server on a real store in a temp
directory (a free port on 127.0.0.1; no Ray: the dispatcher only ever cancels here)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

import farm.dashboard
from farm.core.energy import DevicePower, Energy, EnergyScope, EnergySource
from farm.core.errors import UserError
from farm.core.models import BackendName, BackendOffer, Gpu, GpuMemory, Hardware, JobState, NodeState
from farm.core.phases import ShardPhases
from farm.dashboard import Dashboard, reserve_port
from farm.dashboard.history import History, Reading
from farm.head.auth import Tokens
from farm.head.dispatch import Dispatcher
from farm.head.events import JobEvents
from farm.head.jobs import Jobs
from farm.head.settings import HeadSettings
from farm.head.store import Store
from farm.local import free_port
from farm.tls import HeadTLS

HW = Hardware(hostname="h", os="linux", arch="x86_64", cpu_model="cpu", cpu_cores=8, memory_bytes=2**34)
GPU_HW = HW.model_copy(update={"gpus": (Gpu(index=0, name="NVIDIA H200"),)})
CPU = BackendOffer(name=BackendName.CPU, device="cpu")
CUDA = BackendOffer(name=BackendName.CUDA, device="cuda:0")


def power(device: str, watts: float, source: EnergySource, scope: EnergyScope = EnergyScope.DEVICE) -> DevicePower:
    return DevicePower(device=device, watts=watts, source=source, scope=scope)


def energy(joules: float, source: EnergySource, scope: EnergyScope = EnergyScope.PACKAGE) -> Energy:
    return Energy(joules=joules, seconds=1.0, source=source, scope=scope)


SIGNED_IN = "signed in"  # Served.get's default: the API token, as a signed-in page reads


@dataclass
class Served:
    url: str
    store: Store
    tokens: Tokens
    dashboard: Dashboard
    http: aiohttp.ClientSession  # trusts the head's CA, and sends the API token unless a call says otherwise
    tls: HeadTLS

    async def get(self, path: str, token: str | None = SIGNED_IN) -> tuple[int, object]:
        token = self.tokens.api if token == SIGNED_IN else token
        headers = {"Authorization": f"Bearer {token}" if token else ""}
        async with self.http.get(self.url + path, headers=headers) as response:
            body = await response.text()
            is_json = response.content_type == "application/json"
            return response.status, json.loads(body) if is_json and body else body

    async def post(self, path: str, token: str | None = None) -> tuple[int, dict[str, object]]:
        headers = {"Authorization": f"Bearer {token}" if token else ""}
        async with self.http.post(self.url + path, headers=headers) as response:
            return response.status, await response.json()


@asynccontextmanager
async def serving(tmp_path: Path, sample_every_s: float = 60.0, **options: Any) -> AsyncIterator[Served]:
    """The dashboard as `farm head start` composes it: the head's store, its Jobs, its tokens under the head's policy
    (`options`: HeadSettings' fields) and its TLS identity."""
    settings = HeadSettings(state_dir=tmp_path, host="127.0.0.1", port=free_port(), **options)
    tokens = Tokens.load_or_create(tmp_path, settings.ray_token_path).for_server(settings)
    tls = HeadTLS.load_or_create(settings.tls_dir, ["127.0.0.1"])
    store = Store(tmp_path / "state.db")
    events = JobEvents()
    jobs = Jobs(store, Dispatcher(store, settings, events.publish), events, settings)
    dashboard = Dashboard("127.0.0.1", reserve_port("127.0.0.1", None, default=free_port()), "127.0.0.1",
                          sample_every_s=sample_every_s)  # as the head: on a socket bound at the pick
    info = await dashboard.start(store, jobs, tokens, tls)
    assert info == {"dashboard": dashboard.url} and dashboard.url.startswith("https://127.0.0.1:")
    trusted = ssl.create_default_context(cadata=tls.ca_pem.decode())
    try:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {tokens.api}"},
                                         connector=aiohttp.TCPConnector(ssl=trusted)) as http:
            yield Served(dashboard.url, store, tokens, dashboard, http, tls)
    finally:
        await dashboard.stop()
        store.close()


def run(tmp_path: Path, scenario: Callable[[Served], Awaitable[None]], **options: Any) -> None:
    async def main() -> None:
        async with serving(tmp_path, **options) as served:
            await scenario(served)

    asyncio.run(main())


def a_fleet(store: Store) -> None:
    """An H200 box (NVML counter), a Mac-like node (vendor estimate), a CPU box whose owner is busy, an offline one."""
    store.upsert_node("n-gpu", "gpu-box", GPU_HW, [CUDA, CPU], "10.0.0.1", "h")
    store.upsert_node("n-mac", "mac", HW, [BackendOffer(name=BackendName.MPS, device="mps"), CPU], "10.0.0.2", "h")
    store.upsert_node("n-cpu", "laptop", HW, [CPU], "10.0.0.3", "h")
    store.upsert_node("n-off", "gone", HW, [CPU], "10.0.0.4", "h")
    for node_id in ("n-gpu", "n-mac", "n-cpu"):
        store.set_node_state(node_id, NodeState.READY)
    store.set_node_state("n-off", NodeState.OFFLINE)
    store.heartbeat("n-gpu", 40.0, 20.0, (power("cuda:0", 300.0, EnergySource.COUNTER),))
    store.heartbeat("n-mac", 10.0, 30.0, (power("mps", 12.0, EnergySource.VENDOR_ESTIMATE),))
    store.heartbeat("n-cpu", 90.0, 50.0, (power("cpu", 35.0, EnergySource.MODEL_ESTIMATE, EnergyScope.PACKAGE),),
                    busy="owner's CPU load 85% > 50%")


def a_job_half_done(store: Store) -> None:
    """Two shards: one finished on the GPU box (counter energy), one running there."""
    store.add_job("j-1", "digits", "inference", "name: digits\n", "/code.zip", "/out", 100, [(0, 50), (50, 100)])
    store.set_job_state("j-1", JobState.RUNNING)
    gpu = next(n for n in store.nodes() if n.id == "n-gpu")
    store.shard_started("j-1", 0, gpu, "cuda", "cuda:0")
    store.shard_started("j-1", 1, gpu, "cuda", "cuda:0")
    store.shard_succeeded("j-1", 0, 50, 0.5, None, energy(25.0, EnergySource.COUNTER, EnergyScope.DEVICE),
                          peak_memory_bytes=3 * 2**30, marginal_j=10.0,
                          metrics=ShardPhases(load=0.3, warm_up=1.2, input_wait=0.2).metrics())
    store.set_explanation("j-1", "round 1: efficiency; gpu-box cuda:0 2.0 items/J (counter)")


def test_the_fleet_api_shows_each_node_with_its_power_source_activity_and_the_totals(tmp_path: Path) -> None:
    async def scenario(served: Served) -> None:
        a_fleet(served.store)
        a_job_half_done(served.store)
        status, fleet = await served.get("api/fleet")
        assert status == 200 and isinstance(fleet, dict)
        nodes = {n["name"]: n for n in fleet["nodes"]}
        assert set(nodes) == {"gpu-box", "mac", "laptop", "gone"}
        gpu, mac, laptop = nodes["gpu-box"], nodes["mac"], nodes["laptop"]
        assert (gpu["power_w"], gpu["power_source"], gpu["power_estimate"]) == (300.0, "counter", False)
        assert (mac["power_source"], mac["power_estimate"]) == ("vendor-estimate", True)
        assert (laptop["power_source"], laptop["power_estimate"]) == ("model-estimate", True)
        assert gpu["activity"] == "working" and gpu["shards_running"] == 1
        assert laptop["activity"] == "busy" and "owner" in laptop["busy"]
        assert mac["activity"] == "idle" and nodes["gone"]["activity"] == "offline"
        assert gpu["items_done"] == 50 and "items_per_j" not in gpu  # per model only (the node's page)
        status, gpu_page = await served.get("api/nodes/n-gpu")
        assert status == 200 and isinstance(gpu_page, dict)
        assert [(m["model"], m["items_per_j"]) for m in gpu_page["models"]] == [("digits", pytest.approx(2.0))]
        totals = fleet["totals"]
        assert totals["nodes"] == 4 and totals["by_state"] == {"ready": 3, "offline": 1}
        assert totals["power_w"] == pytest.approx(347.0)  # live nodes only
        assert (totals["power_source"], totals["power_estimate"]) == ("mixed", True)
        assert totals["cpu_percent"] == pytest.approx((40 + 10 + 90) / 3)
        assert totals["shards_running"] == 1 and totals["energy_j"] == 25.0 and totals["energy_estimate"] is False
        backends = {b["backend"]: b for b in fleet["backends"]}
        assert (backends["cpu"]["nodes"], backends["cpu"]["ready"]) == (4, 3)
        assert backends["cuda"]["nodes"] == 1 and backends["mps"]["nodes"] == 1

    run(tmp_path, scenario)


def test_the_jobs_api_gives_progress_and_the_job_page_its_placement_energy_and_explanation(tmp_path: Path) -> None:
    async def scenario(served: Served) -> None:
        a_fleet(served.store)
        a_job_half_done(served.store)
        status, jobs = await served.get("api/jobs")
        assert status == 200 and isinstance(jobs, list)
        [row] = jobs
        assert (row["id"], row["state"], row["items_done"], row["progress"]) == ("j-1", "running", 50, 0.5)
        assert (row["shards_done"], row["shards_running"]) == (1, 1)
        status, job = await served.get("api/jobs/j-1")
        assert status == 200 and isinstance(job, dict)
        done, running = job["shards_detail"]
        assert (done["node_name"], done["device"], done["backend"], done["state"]) == ("gpu-box", "cuda:0", "cuda",
                                                                                      "succeeded")
        assert (done["seconds"], done["energy_j"], done["energy_source"], done["energy_estimate"]) == (
            0.5, 25.0, "counter", False)
        assert done["peak_memory_bytes"] == 3 * 2**30
        # where its time went on its node: 0.2 s of its 0.5 waiting for input, and 1.5 s before them
        assert (done["input_wait_s"], done["before_s"], done["before"]) == (
            0.2, 1.5, "loading the model 0.30 s, warm-up 1.20 s")
        assert running["state"] == "running" and running["node_name"] == "gpu-box"
        assert (running["input_wait_s"], running["before"]) == (None, "")
        assert "gpu-box cuda:0" in job["explanation"] and job["cancellable"] is True
        assert await served.get("api/jobs/j-nope") == (404, {"error": "no job 'j-nope'"})
        assert (await served.get("api/jobs?limit=x"))[0] == 400

    run(tmp_path, scenario)


def test_cancelling_needs_the_api_token_and_goes_through_the_head_s_jobs(tmp_path: Path) -> None:
    async def scenario(served: Served) -> None:
        served.store.add_job("j-2", "toy", "inference", "name: toy\n", "/code.zip", "/out", 10, [(0, 10)])
        assert (await served.post("api/jobs/j-2/cancel"))[0] == 401
        assert (await served.post("api/jobs/j-2/cancel", token="forged"))[0] == 401
        assert (await served.post("api/jobs/j-2/cancel", token=served.tokens.join))[0] == 401
        assert served.store.job("j-2").state is JobState.QUEUED  # read-only without the token

        status, job = await served.post("api/jobs/j-2/cancel", token=served.tokens.api)
        assert status == 200 and job["state"] == "cancelled" and job["cancellable"] is False
        assert served.store.job("j-2").state is JobState.CANCELLED
        status, error = await served.post("api/jobs/j-2/cancel", token=served.tokens.api)
        assert status == 409 and "already cancelled" in str(error["error"])
        assert (await served.post("api/jobs/j-none/cancel", token=served.tokens.api))[0] == 404

        assert (await served.get("api/auth", token=None))[0] == 401  # what the sign-in form checks
        assert (await served.get("api/auth", token=served.tokens.api))[0] == 204

    run(tmp_path, scenario)


def test_metrics_scrape_cleanly_with_each_figure_labelled(tmp_path: Path) -> None:
    async def scenario(served: Served) -> None:
        a_fleet(served.store)
        a_job_half_done(served.store)
        served.store.add_job("j-3", "queued-one", "inference", "name: q\n", "/code.zip", "/out", 10, [(0, 10)])
        async with served.http.get(served.url + "metrics") as response:
            assert response.status == 200 and response.content_type == "text/plain"
            text = await response.text()
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
        }

        def value(metric: str, /, **labels: str) -> float:
            return samples[(metric, tuple(sorted(labels.items())))]

        assert value("farm_up") == 1
        assert value("farm_nodes", state="ready") == 3 and value("farm_nodes", state="offline") == 1
        assert value("farm_jobs", state="running") == 1 and value("farm_jobs", state="queued") == 1
        assert value("farm_jobs", state="succeeded") == 0
        gpu = {"node": "n-gpu", "name": "gpu-box"}
        assert value("farm_node_cpu_utilisation_ratio", **gpu) == pytest.approx(0.4)
        assert value("farm_node_power_watts", **gpu, device="cuda:0", source="counter", scope="device") == 300.0
        assert value("farm_node_power_watts", node="n-cpu", name="laptop", device="cpu", source="model-estimate",
                     scope="package") == 35.0
        assert value("farm_node_energy_joules_total", **gpu, source="counter", scope="device") == 25.0
        assert value("farm_node_items_total", **gpu) == 50
        assert value("farm_node_shards_running", **gpu) == 1
        assert value("farm_node_busy", node="n-cpu", name="laptop") == 1
        assert value("farm_job_progress_ratio", job_id="j-1", name="digits") == 0.5
        assert value("farm_job_energy_joules", job_id="j-1", name="digits", source="counter") == 25.0
        # Above the GPU's idle draw, beside the total: the efficiency policy ranks by it by default.
        assert value("farm_node_marginal_energy_joules_total", **gpu, source="counter", scope="device") == 10.0
        assert value("farm_job_marginal_energy_joules", job_id="j-1", name="digits", source="counter") == 10.0
        assert value("farm_job_info", job_id="j-3", name="queued-one", kind="inference", state="queued") == 1
        assert any(name == "process_resident_memory_bytes" for name, _ in samples)  # the head process's health

    run(tmp_path, scenario)


def test_the_live_stream_sends_each_new_sample_to_the_page(tmp_path: Path) -> None:
    async def scenario(served: Served) -> None:
        a_fleet(served.store)
        async with served.http.get(served.url + "api/events") as response:
            assert response.content_type == "text/event-stream"
            # A tick made for the page as it opens (not the next period's, a minute away here), then one per period.
            first = await next_tick(response)
            assert first["sample"]["values"]["n-gpu"] == [40.0, 300.0]
            assert "n-off" not in first["sample"]["values"]  # offline: a gap in its series, not a zero
            served.store.heartbeat("n-gpu", 75.0, 20.0, (power("cuda:0", 650.0, EnergySource.COUNTER),))
            served.store.add_job("j-4", "new", "inference", "name: new\n", "/code.zip", "/out", 10, [(0, 10)])
            # The change reaches the open stream without another request.
            later = await next_tick(response)
            while later["sample"]["values"]["n-gpu"] != [75.0, 650.0]:
                later = await next_tick(response)
            assert [j["id"] for j in later["jobs"]] == ["j-4"]
        status, history = await served.get("api/history")
        assert status == 200 and isinstance(history, dict)
        gpu = next(n for n in history["nodes"] if n["id"] == "n-gpu")
        assert len(history["t"]) >= 3 and len(gpu["cpu"]) == len(history["t"])
        assert gpu["cpu"][0] is None and 40.0 in gpu["cpu"] and gpu["power"][-1] == 650.0  # it joined after tick 1

    run(tmp_path, scenario, sample_every_s=0.2)


def test_with_no_page_open_the_history_still_follows_the_heartbeats(tmp_path: Path) -> None:
    async def scenario(served: Served) -> None:
        a_fleet(served.store)
        served.store.heartbeat("n-gpu", 75.0, 20.0, (power("cuda:0", 650.0, EnergySource.COUNTER),))
        await served.dashboard.sample()  # no watcher: the light read, no page update
        gpu = next(n for n in served.dashboard.history.series(time.time(), limit=10)["nodes"] if n["id"] == "n-gpu")
        assert (gpu["cpu"][-1], gpu["power"][-1]) == (75.0, 650.0)

    run(tmp_path, scenario)


def test_a_page_that_opens_gets_a_tick_at_once_not_at_the_next_period(tmp_path: Path) -> None:
    async def scenario(served: Served) -> None:
        a_fleet(served.store)
        async with served.http.get(served.url + "api/events") as response:
            tick = await asyncio.wait_for(next_tick(response), timeout=30)  # the period is 10 minutes here
            assert {n["name"] for n in tick["fleet"]["nodes"]} == {"gpu-box", "mac", "laptop", "gone"}

    run(tmp_path, scenario, sample_every_s=600)


async def next_tick(response: aiohttp.ClientResponse) -> dict[str, Any]:
    event = ""
    async for line in response.content:
        text = line.decode().rstrip("\n")
        if text.startswith("event: "):
            event = text.removeprefix("event: ")
        elif text.startswith("data: ") and event == "tick":
            update: dict[str, Any] = json.loads(text.removeprefix("data: "))
            return update
    raise AssertionError("the stream ended")


def test_the_page_and_its_assets_come_from_the_head_alone(tmp_path: Path) -> None:
    async def scenario(served: Served) -> None:
        async with served.http.get(served.url) as response:
            page = await response.text()
            assert response.status == 200 and "default-src 'self'" in response.headers["Content-Security-Policy"]
        assert 'src="static/app.js"' in page and 'src="static/uPlot.iife.min.js"' in page
        assert "http://" not in page and "https://" not in page  # no CDN: the page works offline
        for asset in ("static/app.js", "static/app.css", "static/uPlot.iife.min.js", "static/uPlot.min.css"):
            async with served.http.get(served.url + asset) as response:
                assert response.status == 200, asset
                assert "https://cdn" not in await response.text()

    run(tmp_path, scenario)


def test_history_keeps_fifteen_minutes_and_charts_the_busiest_nodes() -> None:
    history = History(every_s=2.0)
    start = 1_000_000.0
    for tick in range(600):  # 20 minutes of ticks, 2 s apart
        readings = {f"n-{i}": Reading(f"node-{i}", cpu_percent=float(i), power_w=10.0 * i) for i in range(30)}
        if tick % 2:
            del readings["n-5"]  # not live at every other tick: a gap
        history.add(start + 2 * tick, readings)
    now = start + 2 * 599
    series = history.series(now, limit=3)
    assert series["t"][0] >= now - 900 and series["t"][-1] == now and len(series["t"]) == 451
    assert series["nodes_total"] == 30
    assert [n["id"] for n in series["nodes"]] == ["n-27", "n-28", "n-29"]  # the busiest three, by name
    assert series["nodes"][0]["power"][-1] == 270.0
    node_5 = next(n for n in history.series(now, limit=30)["nodes"] if n["id"] == "n-5")
    assert None in node_5["cpu"] and 5.0 in node_5["cpu"]


def test_the_dashboard_port_falls_back_only_when_none_was_asked_for() -> None:
    def port(sock: socket.socket) -> int:
        with sock:
            return int(sock.getsockname()[1])

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        assert port(reserve_port("127.0.0.1", None, default=busy)) != busy
        with pytest.raises(UserError, match="--dashboard-port"):
            reserve_port("127.0.0.1", busy, default=busy)
    free = free_port()
    assert port(reserve_port("127.0.0.1", None, default=free)) == free
    assert port(reserve_port("127.0.0.1", 0, default=free)) > 0
    # Never the head's own ports, bound after the pick (`--data-port` at --port + 2, say).
    assert port(reserve_port("127.0.0.1", None, default=free, avoid={free})) != free


def test_the_reserved_port_is_held_until_the_dashboard_listens_on_it(tmp_path: Path) -> None:
    """Ray, started between the pick and the dashboard's start, found a port only checked free and took it; the
    dashboard then serves on the socket held since the pick (as every test here: `serving`), and lets it go."""
    reserved = reserve_port("127.0.0.1", None, default=free_port())
    with reserved, socket.socket() as meanwhile, pytest.raises(OSError):
        meanwhile.bind(("127.0.0.1", reserved.getsockname()[1]))

    served_on: list[int] = []

    async def scenario(served: Served) -> None:
        assert served.dashboard.reserved is not None and (await served.get("api/fleet"))[0] == 200
        served_on.append(served.dashboard.port)

    run(tmp_path, scenario)
    with socket.socket() as after:
        after.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        after.bind(("127.0.0.1", served_on[0]))


def test_the_grafana_dashboard_charts_only_metrics_the_head_exports(tmp_path: Path) -> None:
    grafana = json.loads((Path(farm.dashboard.__file__).parent / "grafana" / "farm.json").read_text())
    wanted = {
        name for panel in grafana["panels"] for target in panel["targets"]
        for name in re.findall(r"\b(?:farm|process)_[a-z_]+\b", target["expr"])
    }
    assert {"farm_node_power_watts", "farm_node_energy_joules_total", "farm_job_progress_ratio"} <= wanted

    async def scenario(served: Served) -> None:
        a_fleet(served.store)
        a_job_half_done(served.store)
        async with served.http.get(served.url + "metrics") as response:
            exported = {s.name for f in text_string_to_metric_families(await response.text()) for s in f.samples}
        assert wanted <= exported, wanted - exported

    run(tmp_path, scenario)


def test_a_jobs_log_with_what_its_shards_printed_needs_the_api_token(tmp_path: Path) -> None:
    async def scenario(served: Served) -> None:
        a_fleet(served.store)
        a_job_half_done(served.store)
        served.store.log("j-1", "output", "loading the model\nbatch 0", shard=0)
        status, _ = await served.get("api/jobs/j-1/logs", token=None)
        assert status == 401  # a job's output is the job's: as `farm logs`, reading it needs the token
        status, lines = await served.get("api/jobs/j-1/logs", token=served.tokens.api)
        assert status == 200 and isinstance(lines, list)
        assert lines[0]["message"].startswith("accepted:") and lines[0]["shard"] is None
        assert {"level": "output", "message": "loading the model\nbatch 0", "shard": 0}.items() <= lines[-1].items()
        status, later = await served.get(f"api/jobs/j-1/logs?after={lines[-2]['id']}", token=served.tokens.api)
        assert later == lines[-1:]
        status, shard_1 = await served.get("api/jobs/j-1/logs?shard=1", token=served.tokens.api)
        assert shard_1 and all(line["shard"] == 1 for line in shard_1)  # type: ignore[union-attr]
        status, _ = await served.get("api/jobs/j-1/logs?after=x", token=served.tokens.api)
        assert status == 400

    run(tmp_path, scenario)


def test_perf_per_watt_is_per_model_never_across_models(tmp_path: Path) -> None:
    async def scenario(served: Served) -> None:
        a_fleet(served.store)
        gpu = next(n for n in served.store.nodes() if n.id == "n-gpu")
        for job_id, model, items, joules in (("j-a", "digits.model:build", 100, 10.0),
                                             ("j-b", "minilm.model:build", 10, 50.0)):
            served.store.add_job(job_id, job_id, "inference", f"name: {job_id}\nmodel: {model}\n", "/c.zip", "/out",
                                 items, [(0, items)], model_key=f"key-{job_id}")
            served.store.shard_started(job_id, 0, gpu, "cuda", "cuda:0")
            served.store.shard_succeeded(job_id, 0, items, 1.0, None, energy(joules, EnergySource.COUNTER))
        status, fleet = await served.get("api/fleet")
        assert status == 200 and isinstance(fleet, dict)
        models = {m["model"]: m for m in fleet["models"]}
        assert models["digits.model:build"]["items_per_j"] == pytest.approx(10.0)
        assert models["minilm.model:build"]["items_per_j"] == pytest.approx(0.2)
        assert models["digits.model:build"]["backend"] == "cuda" and not models["digits.model:build"]["energy_estimate"]
        assert "items_per_j" not in fleet["totals"]  # 110 items over 60 J would mean nothing

    run(tmp_path, scenario)


def test_a_node_page_and_memory_in_the_history(tmp_path: Path) -> None:
    async def scenario(served: Served) -> None:
        a_fleet(served.store)
        a_job_half_done(served.store)
        for ref in ("n-gpu", "gpu-box"):  # by id or by name
            status, node = await served.get(f"api/nodes/{ref}")
            assert status == 200 and isinstance(node, dict)
            assert node["name"] == "gpu-box" and node["hardware"]["gpus"] == ["NVIDIA H200"]
            assert node["items_done"] == 50 and node["shards_running"] == 1
        assert (await served.get("api/nodes/nope"))[0] == 404
        await served.dashboard.sample()
        status, history = await served.get("api/history")
        gpu = next(n for n in history["nodes"] if n["id"] == "n-gpu")  # type: ignore[index]
        assert gpu["memory"][-1] == 20.0

    run(tmp_path, scenario)


def test_a_nodes_utilisation_is_split_into_the_owners_and_the_farms_and_gpu_memory_is_charted(tmp_path: Path
                                                                                               ) -> None:
    """The laptop's owner works at 78 % while Farm's shards take 12 %: the page says whose load is whose. GPU memory
    is charted for the node whose NVML reported it, and absent for the others (no chart of zeros)."""
    h200 = 150754820096

    async def scenario(served: Served) -> None:
        a_fleet(served.store)
        served.store.heartbeat("n-cpu", 90.0, 50.0, (), farm_cpu_percent=12.0)
        served.store.heartbeat("n-gpu", 40.0, 20.0, (power("cuda:0", 300.0, EnergySource.COUNTER),),
                               farm_cpu_percent=40.0,
                               gpu_memory=(GpuMemory(device="cuda:0", used_bytes=h200 // 4, total_bytes=h200),))
        status, fleet = await served.get("api/fleet")
        assert status == 200 and isinstance(fleet, dict)
        nodes = {n["name"]: n for n in fleet["nodes"]}
        laptop, gpu = nodes["laptop"], nodes["gpu-box"]
        assert (laptop["cpu_percent"], laptop["owner_cpu_percent"], laptop["farm_cpu_percent"]) == (90.0, 78.0, 12.0)
        assert (gpu["owner_cpu_percent"], gpu["farm_cpu_percent"]) == (0.0, 40.0)
        assert gpu["gpu_memory"] == [{"device": "cuda:0", "used_bytes": h200 // 4, "total_bytes": h200,
                                      "percent": 25.0}]
        assert laptop["gpu_memory"] == []
        assert fleet["totals"]["farm_cpu_percent"] == pytest.approx((40 + 0 + 12) / 3)  # the mac sent no split

        await served.dashboard.sample()
        status, history = await served.get("api/history")
        charted = {n["name"]: n for n in history["nodes"]}  # type: ignore[index]
        assert (charted["laptop"]["owner_cpu"][-1], charted["laptop"]["farm_cpu"][-1]) == (78.0, 12.0)
        assert charted["gpu-box"]["gpu_memory"][-1] == 25.0
        assert "gpu_memory" not in charted["laptop"] and "gpu_memory" not in charted["mac"]
        async with served.http.get(served.url + "api/events") as response:
            sample = (await next_tick(response))["sample"]
        assert sample["farm_cpu"]["n-cpu"] == 12.0 and sample["gpu_memory"] == {"n-gpu": 25.0}

        async with served.http.get(served.url + "metrics") as response:
            text = await response.text()
        samples = {(m.name, tuple(sorted(m.labels.items()))): m.value
                   for family in text_string_to_metric_families(text) for m in family.samples}
        laptop_labels = (("name", "laptop"), ("node", "n-cpu"))
        assert samples[("farm_node_farm_cpu_utilisation_ratio", laptop_labels)] == pytest.approx(0.12)
        assert samples[("farm_node_gpu_memory_used_bytes", (("device", "cuda:0"), ("name", "gpu-box"),
                                                            ("node", "n-gpu")))] == h200 // 4

        served.store.save_heartbeats()  # kept in the store as well: a head started again shows them
        again = {n.id: n for n in Store(served.store.path).nodes()}["n-gpu"]
        assert (again.farm_cpu_percent, again.gpu_memory[0].used_bytes) == (40.0, h200 // 4)

    run(tmp_path, scenario)


def test_a_node_page_gives_perf_per_model_for_that_node_alone(tmp_path: Path) -> None:
    async def scenario(served: Served) -> None:
        a_fleet(served.store)
        nodes = {n.id: n for n in served.store.nodes()}
        for job_id, model, node, items, joules in (("j-a", "digits.model:build", "n-gpu", 100, 10.0),
                                                   ("j-b", "minilm.model:build", "n-gpu", 10, 50.0),
                                                   ("j-c", "digits.model:build", "n-mac", 100, 50.0)):
            served.store.add_job(job_id, job_id, "inference", f"name: {job_id}\nmodel: {model}\n", "/c.zip", "/out",
                                 items, [(0, items)], model_key=f"key-{model}")
            served.store.shard_started(job_id, 0, nodes[node], "cuda", "cuda:0")
            served.store.shard_succeeded(job_id, 0, items, 1.0, None, energy(joules, EnergySource.COUNTER))
        status, page = await served.get("api/nodes/n-gpu")
        assert status == 200 and isinstance(page, dict)
        assert [(m["model"], m["items_per_j"]) for m in page["models"]] == [
            ("digits.model:build", pytest.approx(10.0)), ("minilm.model:build", pytest.approx(0.2))]
        assert "items_per_j" not in page  # 110 items over 60 J, across two models, would mean nothing

    run(tmp_path, scenario)


READS = ("api/fleet", "api/jobs", "api/jobs/j-1", "api/nodes/gpu-box", "api/history", "api/events", "metrics")


def test_reading_needs_the_api_token_unless_the_head_reads_openly(tmp_path: Path) -> None:
    """Issue 18, finding 10: the dashboard's reads needed no token, where gRPC's listings do without --open-read."""
    async def closed(served: Served) -> None:
        a_fleet(served.store)
        a_job_half_done(served.store)
        for path in READS:
            assert (await served.get(path, token=None))[0] == 401, path
            assert (await served.get(path, token="forged"))[0] == 401, path
        for path in ("", "static/app.js"):  # the page itself holds no data: it asks for the token
            assert (await served.get(path, token=None))[0] == 200, path
        assert (await served.get("api/fleet"))[0] == 200

    async def open_read(served: Served) -> None:
        a_fleet(served.store)
        a_job_half_done(served.store)
        for path in READS:
            if path != "api/events":  # a stream: open is enough
                assert (await served.get(path, token=None))[0] == 200, path
        async with served.http.get(served.url + "api/events", headers={"Authorization": ""}) as response:
            assert response.status == 200
        assert (await served.get("api/jobs/j-1/logs", token=None))[0] == 401  # a job's output is still the job's
        assert (await served.post("api/jobs/j-1/cancel"))[0] == 401

    run(tmp_path / "closed", closed)
    run(tmp_path / "open", open_read, open_read=True)


def test_the_dashboard_speaks_tls_with_the_head_s_certificate(tmp_path: Path) -> None:
    """Issue 18, finding 10: it was plain HTTP on 0.0.0.0, so signing in sent the API token in the clear."""
    async def scenario(served: Served) -> None:
        plain = served.url.replace("https://", "http://")
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientError):  # no plain HTTP beside it
                async with http.get(plain + "api/auth"):
                    pass
            with pytest.raises(aiohttp.ClientConnectorCertificateError):  # a CA of the system's does not vouch for it
                async with http.get(served.url):
                    pass
        # The head's CA does, for the name 127.0.0.1 (the session checks the certificate and its host name).
        assert (await served.get("api/auth"))[0] == 204

    run(tmp_path, scenario)
    # Plain HTTP only when asked, and only on loopback.
    with pytest.raises(UserError, match="plain HTTP only on loopback"):
        Dashboard("0.0.0.0", free_port(), "10.0.0.1", plain_http=True)

    async def plain_on_loopback() -> None:
        settings = HeadSettings(state_dir=tmp_path, host="127.0.0.1", port=free_port())
        store = Store(tmp_path / "state.db")
        events = JobEvents()
        dashboard = Dashboard("127.0.0.1", free_port(), "127.0.0.1", plain_http=True)
        await dashboard.start(store, Jobs(store, Dispatcher(store, settings, events.publish), events, settings),
                              Tokens.load_or_create(tmp_path, settings.ray_token_path),
                              HeadTLS.load_or_create(settings.tls_dir, ["127.0.0.1"]))
        try:
            assert dashboard.url.startswith("http://127.0.0.1:")
            async with aiohttp.ClientSession() as http, http.get(dashboard.url) as response:
                assert response.status == 200
        finally:
            await dashboard.stop()
            store.close()

    asyncio.run(plain_on_loopback())


def test_failed_sign_ins_are_limited_per_address_and_logged_escaped(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Issue 18, finding 10: failed sign-ins were neither limited nor logged. Here as gRPC's: a few per address and
    window (the head's one limiter), then refused unchecked; each logged with the address, never the token."""
    async def scenario(served: Served) -> None:
        assert (await served.get("api/fleet", token=None))[0] == 401  # no token: a page before sign-in, not a guess
        for _ in range(3):
            assert (await served.get("api/auth", token="guess"))[0] == 401
        status, body = await served.get("api/auth")  # the right token, too late
        assert status == 401 and "too many failed authentications from 127.0.0.1" in str(body)
        status, _ = await served.get("api/fleet")
        assert status == 401
        # A gRPC caller from that address is refused by the same limiter.
        assert served.tokens.limiter.blocked_for("127.0.0.1") > 0

    async def forged_line(served: Served) -> None:
        assert (await served.get("api/jobs/x%0A2026-12-03 INFO farm.head: all is well", token="guess"))[0] == 401

    with caplog.at_level(logging.WARNING, logger="farm.head.auth"):
        run(tmp_path / "a", scenario, auth_failures_allowed=3, limit_loopback=True)
        run(tmp_path / "b", forged_line)
    refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused")]
    assert len(refusals) == 4, refusals  # three guesses and the forged path: the request without a token is not one
    assert all("from 127.0.0.1: invalid or missing API token (credential hash " in m for m in refusals)
    assert all("guess" not in m and "\n" not in m for m in refusals)
    assert "the dashboard's GET '/api/jobs/x\\n2026-12-03 INFO farm.head: all is well'" in refusals[-1]


def test_a_node_page_charts_that_node_s_own_history(tmp_path: Path) -> None:
    """A node's page carries its own series over the window (its CPU, Farm's and the owner's, and its power), whoever
    the fleet's charts show; a node never sampled has none."""
    async def scenario(served: Served) -> None:
        a_fleet(served.store)
        served.store.heartbeat("n-cpu", 90.0, 50.0, (power("cpu", 35.0, EnergySource.MODEL_ESTIMATE),),
                               farm_cpu_percent=12.0)
        await served.dashboard.sample()
        status, node = await served.get("api/nodes/laptop")
        assert status == 200 and isinstance(node, dict)
        history = node["history"]
        assert [n["id"] for n in history["nodes"]] == ["n-cpu"] and history["t"]
        laptop = history["nodes"][0]
        assert (laptop["farm_cpu"][-1], laptop["owner_cpu"][-1], laptop["power"][-1]) == (12.0, 78.0, 35.0)
        status, gone = await served.get("api/nodes/gone")  # offline: never sampled
        assert isinstance(gone, dict) and gone["history"]["nodes"] == []

    run(tmp_path, scenario)
