"""helm/farm rendered by Helm's own engine (helm-python-sdk embeds it) and the rendered objects checked against the
real `farm` command line and the dashboard they point at."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from farm.cli import agent as agent_cli
from farm.cli import head as head_cli
from farm.core.errors import UserError
from tests.conftest import ROOT

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (the dev extra) renders the chart")

CHART = ROOT / "helm" / "farm"
Objects = dict[tuple[str, str], dict[str, Any]]


def render(values: dict[str, Any] | None = None) -> Objects:
    manifests = helm.Chart.load(str(CHART)).render(values or {}, name="rel", namespace="farm-ns")
    objects: Objects = {}
    for path, text in manifests.items():
        if path.endswith(".yaml"):
            for doc in yaml.safe_load_all(text):
                if doc:
                    objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def options(command: list[str]) -> dict[str, str]:
    """`--flag=value` arguments of a rendered container command."""
    return dict(a.removeprefix("--").split("=", 1) for a in command if a.startswith("--"))


def cli_options(app: typer.Typer, name: str) -> set[str]:
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return {opt.removeprefix("--") for p in command.params for opt in p.opts if opt.startswith("--")}


def container(obj: dict[str, Any]) -> dict[str, Any]:
    (only,) = obj["spec"]["template"]["spec"]["containers"]
    return only


def test_lint_is_clean() -> None:
    report = helm.lint(str(CHART), strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_default_render() -> None:
    objects = render()
    assert set(objects) == {("Secret", "rel-farm-tokens"), ("Service", "rel-farm-head"),
                            ("Service", "rel-farm-head-headless"), ("StatefulSet", "rel-farm-head")}


@pytest.mark.parametrize("ports", [{"grpc": 7700, "ray": 7701, "dashboard": 7702, "mtls": 7703},
                                   {"grpc": 9000, "ray": 9100, "dashboard": 8080, "mtls": 9001}])
def test_head_ports_flags_and_service_agree(ports: dict[str, int]) -> None:
    objects = render({"head": {"ports": ports}})
    head = container(objects[("StatefulSet", "rel-farm-head")])
    assert head["command"][:3] == ["farm", "head", "start"]
    flags = options(head["command"])
    assert set(flags) <= cli_options(head_cli.app, "start"), "every flag must exist on the real `farm head start`"
    assert (int(flags["port"]), int(flags["ray-port"]), int(flags["dashboard-port"]), int(flags["mtls-port"])) == (
        ports["grpc"], ports["ray"], ports["dashboard"], ports["mtls"])
    container_ports = {p["name"]: p["containerPort"] for p in head["ports"]}
    assert container_ports == {"grpc": ports["grpc"], "ray-gcs": ports["ray"], "dashboard": ports["dashboard"],
                               "mtls": ports["mtls"]}
    service = objects[("Service", "rel-farm-head")]["spec"]
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["ports"]} == {
        "grpc": (ports["grpc"], "grpc"), "ray-gcs": (ports["ray"], "ray-gcs"),
        "dashboard": (ports["dashboard"], "dashboard"), "mtls": (ports["mtls"], "mtls")}
    assert service["selector"] == objects[("StatefulSet", "rel-farm-head")]["spec"]["template"]["metadata"]["labels"]
    # The head advertises its pod's IP: Ray's own ports on it are reached directly, not through the Service.
    (advertise,) = [e for e in head["env"] if e["name"] == "FARM_ADVERTISE"]
    assert flags["advertise"] == "$(FARM_ADVERTISE)"
    assert advertise["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_secret_is_mounted_where_the_head_is_told() -> None:
    objects = render({"secrets": {"joinToken": "jt", "apiToken": "at"}})
    statefulset = objects[("StatefulSet", "rel-farm-head")]
    head = container(statefulset)
    mounts = {m["name"]: m for m in head["volumeMounts"]}
    assert options(head["command"])["secrets-dir"] == mounts["secrets"]["mountPath"] and mounts["secrets"]["readOnly"]
    (volume,) = [v for v in statefulset["spec"]["template"]["spec"]["volumes"] if v["name"] == "secrets"]
    assert volume["secret"]["secretName"] == "rel-farm-tokens"
    # Readable by the unprivileged user the head runs as: the group the pod's fsGroup gives the mounted files.
    security = statefulset["spec"]["template"]["spec"]["securityContext"]
    assert volume["secret"]["defaultMode"] == 0o440 and security["fsGroup"] == security["runAsGroup"]
    # The files the head reads (join-token, api-token) come from keys the Secret has.
    secret = objects[("Secret", "rel-farm-tokens")]
    assert {i["key"]: i["path"] for i in volume["secret"]["items"]} == {
        "join-token": "join-token", "api-token": "api-token", "ca.crt": "ca.crt", "ca.key": "ca.key"}
    import base64

    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert (data.pop("join-token"), data.pop("api-token")) == ("jt", "at")
    # The CA the chart made: the head adopts it (--secrets-dir), the agents trust it (--ca).
    assert data["ca.crt"].startswith("-----BEGIN CERTIFICATE-----") and "PRIVATE KEY" in data["ca.key"]
    # The state folder is the claim's mount.
    assert options(head["command"])["state-dir"] == mounts["state"]["mountPath"] == "/var/lib/farm"
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "state" and claim["spec"]["resources"]["requests"]["storage"] == "10Gi"


def test_generated_tokens_and_an_existing_secret() -> None:
    generated = render()[("Secret", "rel-farm-tokens")]["data"]
    assert all(len(v) > 20 for v in generated.values())
    objects = render({"secrets": {"existingSecret": "mine"}, "agents": {"enabled": True}})
    assert not [k for k in objects if k[0] == "Secret"]
    for name in ("rel-farm-head", "rel-farm-agent"):
        kind = "StatefulSet" if name.endswith("head") else "DaemonSet"
        volumes = objects[(kind, name)]["spec"]["template"]["spec"]["volumes"]
        secret_volumes = [v["secret"]["secretName"] for v in volumes if "secret" in v]
        assert secret_volumes == ["mine"]


def test_secrets_dir_feeds_the_tokens_the_head_loads(tmp_path: Path) -> None:
    """`farm head start --secrets-dir` (what the chart passes) puts the mounted tokens where the head loads them."""
    import base64

    from cryptography import x509

    from farm.head.auth import Tokens
    from farm.head.server import head_tls
    from farm.head.settings import HeadSettings
    from farm.local import free_port

    mounted = tmp_path / "secrets"
    mounted.mkdir()
    (mounted / "join-token").write_text("the-join\n")
    (mounted / "api-token").write_text("the-api\n")
    settings = HeadSettings(state_dir=tmp_path / "state", host="127.0.0.1", advertise="127.0.0.1", port=free_port(),
                            ray_port=free_port())
    ca = render()[("Secret", "rel-farm-tokens")]["data"]  # a CA as Helm's genCA makes it (RSA)
    (mounted / "ca.crt").write_bytes(base64.b64decode(ca["ca.crt"]))
    (mounted / "ca.key").write_bytes(base64.b64decode(ca["ca.key"]))
    head_cli._adopt_secrets(mounted, settings)
    tokens = Tokens.load_or_create(settings.state_dir, settings.ray_token_path)
    assert (tokens.join, tokens.api) == ("the-join", "the-api")
    tls = head_tls(settings)  # the head's certificate, signed by the chart's CA
    assert tls.ca_pem == (mounted / "ca.crt").read_bytes()
    server = x509.load_pem_x509_certificate(tls.server_chain_pem)
    server.verify_directly_issued_by(x509.load_pem_x509_certificate(tls.ca_pem))
    (mounted / "api-token").unlink()
    with pytest.raises(UserError, match="cannot read .*api-token"):
        head_cli._adopt_secrets(mounted, settings)


def test_probes_hit_the_dashboard_page() -> None:
    head = container(render()[("StatefulSet", "rel-farm-head")])
    ports = {p["name"]: p["containerPort"] for p in head["ports"]}
    probes = [head[k]["httpGet"] for k in ("startupProbe", "readinessProbe", "livenessProbe")]
    assert {(p["path"], p["port"], p["scheme"]) for p in probes} == {("/", "dashboard", "HTTPS")}
    assert ports["dashboard"] == int(options(head["command"])["dashboard-port"])
    assert asyncio.run(_status_of("/")) == 200  # the real dashboard app serves that path


async def _status_of(path: str) -> int:
    from aiohttp.test_utils import TestClient, TestServer

    from farm.dashboard import Dashboard

    async with TestClient(TestServer(Dashboard("127.0.0.1", 0, "127.0.0.1").app())) as client:
        return (await client.get(path)).status


def test_gpu_agents_only_when_enabled() -> None:
    assert not [k for k in render() if k[0] == "DaemonSet"]
    objects = render({"agents": {"enabled": True, "gpusPerNode": 2, "cpus": 16}})
    daemonset = objects[("DaemonSet", "rel-farm-agent")]
    spec = daemonset["spec"]["template"]["spec"]
    agent = container(daemonset)
    flags = options(agent["command"])
    assert agent["command"][:3] == ["farm", "agent", "start"] and "detach" not in flags
    assert set(flags) <= cli_options(agent_cli.app, "start")
    assert flags["head"] == "rel-farm-head.farm-ns.svc:7700" and flags["cpus"] == "16"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert agent["resources"]["limits"]["nvidia.com/gpu"] == 2
    # The join token arrives as a file from the chart's Secret, never as an argument.
    assert "token" not in flags
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    (join,) = [v for v in spec["volumes"] if v["name"] == "join"]
    assert flags["token-file"] == f"{mounts['join']}/{join['secret']['items'][0]['path']}"
    assert join["secret"]["secretName"] == "rel-farm-tokens" and join["secret"]["items"][0]["key"] == "join-token"
    # The head's CA, from the same Secret: the agent trusts the head through it, and the head's certificate names
    # the Service the agent dials.
    assert {"key": "ca.crt", "path": "ca.crt"} in join["secret"]["items"] and flags["ca"] == f"{mounts['join']}/ca.crt"
    head = options(container(objects[("StatefulSet", "rel-farm-head")])["command"])
    assert flags["head"].rpartition(":")[0] == head["tls-name"]
    assert spec["terminationGracePeriodSeconds"] >= 60  # time for the agent to drain its Ray node


def test_ingress_and_host_network() -> None:
    assert not [k for k in render() if k[0] == "Ingress"]
    objects = render({"ingress": {"enabled": True, "host": "farm.lan", "annotations": {"a.example/b": "c"}},
                      "head": {"hostNetwork": True}})
    ingress = objects[("Ingress", "rel-farm-dashboard")]
    assert ingress["metadata"]["annotations"] == {"nginx.ingress.kubernetes.io/backend-protocol": "HTTPS",
                                                  "a.example/b": "c"}  # the dashboard speaks TLS itself
    rule = ingress["spec"]["rules"][0]
    assert rule["host"] == "farm.lan"
    assert rule["http"]["paths"][0]["backend"]["service"] == {"name": "rel-farm-head", "port": {"name": "dashboard"}}
    pod = objects[("StatefulSet", "rel-farm-head")]["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    (advertise,) = [e for e in pod["containers"][0]["env"] if e["name"] == "FARM_ADVERTISE"]
    assert advertise["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"


@pytest.mark.parametrize("bad", [
    {"head": {"ports": {"grpc": 70000}}},
    {"head": {"ports": {"ray": "7701"}}},
    {"image": {"pullPolicy": "Sometimes"}},
    {"agents": {"gpusPerNode": 0}},
    {"agents": {"enabeld": True}},
    {"service": {"type": "Headless"}},
])
def test_schema_rejects_bad_values(bad: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        render(bad)
