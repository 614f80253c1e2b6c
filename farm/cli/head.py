"""`farm head start|stop|status|forget-node` and `farm head token create|list|revoke|rotate-ray`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from farm.cli.options import Json, StateDir, count, duration, start_in_background, state_dir
from farm.cli.render import console
from farm.core.errors import UserError
from farm.local import primary_ip, read_json, recorded_alive, terminate, write_json, write_private
from farm.tls_pin import ca_hash, join_command

if TYPE_CHECKING:
    from farm.head.settings import HeadSettings
    from farm.head.store import Store

app = typer.Typer(help="Run the head: the control plane, the scheduler and the Ray head.", no_args_is_help=True)


@app.command()
def start(
    port: Annotated[int, typer.Option(help="gRPC port agents and the CLI connect to.")] = 7700,
    ray_port: Annotated[int | None, typer.Option(help="Ray's GCS port (default: --port + 1).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    advertise: Annotated[
        str | None, typer.Option(help="Address agents reach this head at (default: this machine's first IPv4).")
    ] = None,
    state: StateDir = None,
    detach: Annotated[bool, typer.Option("--detach", help="Run in the background and return once ready.")] = False,
    dashboard_port: Annotated[
        int | None, typer.Option(help="The web dashboard's and /metrics' port (default: --port + 2, else a free one).")
    ] = None,
    secrets_dir: Annotated[Path | None, typer.Option(
        help="Take the join and API tokens from the files join-token and api-token in this folder (a mounted "
             "Kubernetes Secret) rather than from the state folder, where they are generated on first start.")] = None,
    insecure: Annotated[bool, typer.Option(
        "--insecure", help="Serve gRPC without TLS (and agents without mutual TLS): only behind something that "
                           "terminates TLS for the head, or on a network you trust. Tokens then cross in the clear.")
    ] = False,
    mtls_port: Annotated[int | None, typer.Option(
        help="Where joined agents beat over mutual TLS (default: --port + 3).", min=1, max=65535)] = None,
    data_port: Annotated[int | None, typer.Option(
        help="Where nodes read the head's data in bulk, on several connections (default: --port + 4).", min=1,
        max=65535)] = None,
    data_lanes: Annotated[int | None, typer.Option(
        help="Threads serving the data port (default: one per core, at most 8; 0: nodes read on --port only).",
        min=0, max=64)] = None,
    bulk_port: Annotated[int | None, typer.Option(
        help="Where nodes read ranges of large files over plain TLS, beside the data port (default: --port + 5).",
        min=1, max=65535)] = None,
    tls_name: Annotated[list[str] | None, typer.Option(
        "--tls-name", help="Another host name or IP for the head's TLS certificate (a DNS name agents use); "
                           "repeatable. The advertise address, 127.0.0.1, localhost and the host name are in it.")
    ] = None,
    open_read: Annotated[bool, typer.Option(
        "--open-read", help="Let anyone who reaches the head list nodes and jobs and read a job and its logs "
                            "without the API token, over gRPC and on the dashboard (submitting and cancelling still "
                            "need it).")] = False,
    dashboard_http: Annotated[bool, typer.Option(
        "--dashboard-http", help="Serve the dashboard over plain HTTP rather than TLS with the head's certificate: "
                                 "only with --host on loopback (127.0.0.1).")] = False,
    ray_node_manager_port: Annotated[int | None, typer.Option(help="Pin Ray's node manager port.")] = None,
    ray_object_manager_port: Annotated[int | None, typer.Option(help="Pin Ray's object manager port.")] = None,
    ray_min_worker_port: Annotated[int | None, typer.Option(help="Lowest port of Ray's workers.")] = None,
    ray_max_worker_port: Annotated[int | None, typer.Option(help="Highest port of Ray's workers.")] = None,
    output_root: Annotated[Path | None, typer.Option(
        help="Jobs may write their outputs only under this folder (they never may into the state folder).")] = None,
    ray_user: Annotated[str | None, typer.Option(
        help="The user the head's Ray node runs as (job code pinned to it would run as this user). Default: "
             "$FARM_RAY_USER, else farm-ray (made if missing) for a head run as root; `root` accepts root.")] = None,
    join_rate: Annotated[str | None, typer.Option(
        help="New nodes one join token may let in per minute (default 30; 0: no limit). Past it a join is refused "
             "with the seconds to wait.", metavar="N")] = None,
) -> None:
    """Start a head; prints the command that joins other machines to it."""
    from farm.dashboard import Dashboard, check_plain_http, reserve_port
    from farm.head.server import serve
    from farm.head.settings import HeadSettings
    from farm.ray_user import chosen as chosen_ray_user

    loopback = host.startswith("127.") or host == "localhost"
    optional: dict[str, Any] = (  # settings left at their defaults unless given
        {"join_rate_per_min": count(join_rate, "--join-rate", least=0, most=10_000)} if join_rate else {})
    if data_lanes is not None:
        optional["data_lanes"] = data_lanes
    settings = HeadSettings(
        state_dir=state_dir(state), host=host, port=port, ray_port=ray_port or port + 1,
        advertise=advertise or ("127.0.0.1" if loopback else primary_ip()), insecure=insecure, mtls_port=mtls_port,
        tls_names=tuple(tls_name or ()), open_read=open_read, ray_node_manager_port=ray_node_manager_port,
        ray_object_manager_port=ray_object_manager_port, ray_min_worker_port=ray_min_worker_port,
        ray_max_worker_port=ray_max_worker_port, ray_user=chosen_ray_user(ray_user),
        output_root=output_root.expanduser().resolve() if output_root else None, data_port=data_port,
        bulk_port=bulk_port, **optional,
    )
    check_plain_http(host, dashboard_http)
    if detach:
        _start_detached(settings.state_dir, sys.argv[1:])
        return
    if secrets_dir is not None:
        _adopt_secrets(secrets_dir, settings)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The head's process serves the dashboard too, composed here: the head never imports it.
    dashboard = Dashboard(host, reserve_port(host, dashboard_port, default=port + 2, avoid=settings.own_ports),
                          settings.advertise, plain_http=dashboard_http)
    # The join line holds a join token: on a terminal only, never into a log (a detached head's output is its log).
    serve(settings, on_ready=lambda join: console.print(
        f"head ready; dashboard at {dashboard.url}\n" + (
            f"join other machines with:\n  {join}" if sys.stdout.isatty()
            else "join other machines with the line `farm head token create` prints"), highlight=False,
        soft_wrap=True,  # a join line is pasted whole: never wrapped
    ), services=[dashboard])


def _adopt_secrets(folder: Path, settings: HeadSettings) -> None:
    """Write the given tokens where the head reads them (secrets.json in its state folder), so that a Secret, not the
    volume, decides them: rotated in the Secret, they take effect at the next start."""
    from farm.head.server import check_can_start

    tokens = {}
    for key in ("join-token", "api-token"):
        try:
            tokens[key.replace("-", "_")] = (folder / key).read_text().strip()
        except OSError as exc:
            raise UserError(f"--secrets-dir: cannot read {folder / key}: {exc.strerror}") from None
        if not tokens[key.replace("-", "_")]:
            raise UserError(f"--secrets-dir: {folder / key} is empty")
    check_can_start(settings)  # never swap the tokens under a head that runs from this state folder
    write_json(settings.state_dir / "secrets.json", tokens)
    # The CA too, when the Secret has one (the chart makes it, so that agents can trust it before the head runs).
    if (folder / "ca.crt").exists() and (folder / "ca.key").exists():
        write_private(settings.tls_dir / "ca.pem", (folder / "ca.crt").read_bytes())
        write_private(settings.tls_dir / "ca.key", (folder / "ca.key").read_bytes())


def _start_detached(directory: Path, argv: list[str]) -> None:
    info = read_json(directory / "head.json")
    if recorded_alive(info):
        raise UserError(f"a head is already running from {directory} (pid {info['pid']})")
    (directory / "head.json").unlink(missing_ok=True)  # a stale one, from a head that did not stop cleanly
    log = directory / "head.log"
    proc = start_in_background(argv, log, lambda: read_json(directory / "head.json") is not None,
                               "the head did not start")
    info = read_json(directory / "head.json") or {}
    console.print(f"head running (pid {proc.pid}), state in {directory}, log in {log}")
    console.print(f"dashboard at {info.get('dashboard', '-')}", highlight=False)
    if not sys.stdout.isatty():  # the join line holds a join token: on a terminal only, never into a file or a pipe
        console.print("join other machines with the line `farm head token create` prints", highlight=False)
        return
    console.print("join other machines with:")
    console.print(f"  {join_command(info['address'], info['join_token'], info.get('ca_hash', ''))}", highlight=False,
                  soft_wrap=True)  # a join line is pasted whole: never wrapped


@app.command()
def stop(state: StateDir = None) -> None:
    """Stop the local head (and its Ray head)."""
    directory = state_dir(state)
    info = read_json(directory / "head.json")
    if info is None or not recorded_alive(info):
        raise UserError(f"no head running from {directory}")
    terminate(int(info["pid"]))
    console.print(f"head {info['pid']} stopped")


@app.command()
def status(state: StateDir = None, as_json: Json = False) -> None:
    """Whether a head runs from the state folder: its pid, address and dashboard, and its nodes and jobs by state.
    Exits 1 when none runs."""
    import json
    from collections import Counter

    from farm.cli.render import node_state
    from farm.client import Client, find_head
    from farm.core.errors import FarmError

    directory = state_dir(state)
    info = read_json(directory / "head.json") or {}
    running = bool(info) and recorded_alive(info)
    facts: dict[str, object] = {"running": running, "state_dir": str(directory)}
    nodes: Counter[str] = Counter()
    jobs: Counter[str] = Counter()
    error = ""
    if running:
        facts.update({key: info.get(key) for key in ("pid", "address", "dashboard", "tls")})  # never its tokens
        try:
            with Client(find_head(state_dir=directory), timeout=10.0) as client:
                nodes.update(node_state(n) for n in client.nodes())
                jobs.update(j.state for j in client.list_jobs())
            facts.update(nodes=dict(nodes), jobs=dict(jobs))
        except FarmError as exc:  # running, but not answering (starting, or stuck): say so rather than fail
            error = facts["error"] = exc.message
    if as_json:
        print(json.dumps(facts, indent=2))
    elif not running:
        console.print(f"no head running from {directory}", highlight=False, soft_wrap=True)
    else:
        def counted(counter: Counter[str]) -> str:
            return ", ".join(f"{n:,} {word}" for word, n in sorted(counter.items())) or "none"

        console.print(f"head running (pid {info['pid']}) at {info['address']}, state in {directory}\n"
                      f"dashboard at {info.get('dashboard') or '-'}\n"
                      + (f"does not answer: {error}" if error
                         else f"nodes: {counted(nodes)}\njobs (the latest 100): {counted(jobs)}"),
                      highlight=False, soft_wrap=True)
    if not running:
        raise typer.Exit(1)


@app.command("forget-node")
def forget_node(node: Annotated[str, typer.Argument(help="The node's id or name (`farm nodes`).")],
                state: StateDir = None) -> None:
    """Let a node's machine join again under its id without its identity (a machine that lost its state folder).
    Until then only the node itself, with its client certificate, may register under an existing id."""
    store = _token_store(state)
    try:
        node_id = store.forget_node_identity(node)
    finally:
        store.close()
    console.print(f"node {node_id} forgotten: its next Register takes the id back", highlight=False)


token_app = typer.Typer(help="Join tokens: each lets agents join this head until it expires or is revoked.",
                        no_args_is_help=True)
app.add_typer(token_app, name="token")


def _token_store(state: Path | None) -> Store:
    from farm.head.store import Store

    db = state_dir(state) / "state.db"
    if not db.exists():
        raise UserError(f"no head state in {db.parent}: start the head there first")
    return Store(db)


@token_app.command("create")
def token_create(
    ttl: Annotated[str | None, typer.Option(help="How long it is valid: 30m, 1h, 2d (default: until revoked).")] = None,
    description: Annotated[str, typer.Option(help="What it is for (shown by `token list`).")] = "",
    max_uses: Annotated[str | None, typer.Option(
        help="How many new nodes it may let in (default: no limit; a node joining again is no use).",
        metavar="N")] = None,
    state: StateDir = None,
    as_json: Json = False,
) -> None:
    """Make a join token and print the line that joins a machine with it (the token is shown this once)."""
    import json
    import time

    from farm.head.auth import new_join_token

    seconds = duration(ttl, "--ttl") if ttl else 0.0
    uses = count(max_uses, "--max-uses") if max_uses is not None else 0  # 0: no limit
    store = _token_store(state)
    info = read_json(state_dir(state) / "head.json") or {}
    token_id, token, token_hash = new_join_token()
    expires_at = time.time() + seconds if seconds else 0.0
    try:
        store.add_join_token(token_id, token_hash, expires_at, description, uses)
    finally:
        store.close()
    ca_file = state_dir(state) / "tls" / "ca.pem"  # the CA outlives head restarts; head.json only a running head
    trust = ca_hash(ca_file.read_bytes()) if info.get("tls", True) and ca_file.exists() else ""
    join = join_command(info.get("address", "HOST:PORT"), token, trust)
    if as_json:
        print(json.dumps({"id": token_id, "token": token, "expires_at": expires_at, "max_uses": uses,
                          "join_command": join}))
        return
    until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(expires_at)) if expires_at else "until revoked"
    limit = f", for {uses} new node{'s' if uses != 1 else ''}" if uses else ""
    console.print(f"join token {token_id} ({'valid to ' + until if expires_at else until}{limit}); join with:\n"
                  f"  {join}",
                  highlight=False, soft_wrap=True)  # a join line is pasted whole: never wrapped


@token_app.command("list")
def token_list(state: StateDir = None, as_json: Json = False) -> None:
    """The join tokens: id, created, expiry, whether revoked, the nodes each let in and its limit (never the tokens
    themselves). In --json, max_uses 0 is no limit."""
    import json
    import time

    store = _token_store(state)
    try:
        records = store.join_tokens()
    finally:
        store.close()
    if as_json:
        print(json.dumps(records, indent=2))
        return
    now = time.time()
    for r in records:
        state_word = ("revoked" if r["revoked"] else "expired" if r["expires_at"] and r["expires_at"] < now
                      else "valid")
        expires = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["expires_at"])) if r["expires_at"] else "never"
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created_at"]))
        uses = f"{r['uses']} of {r['max_uses']}" if r["max_uses"] else str(r["uses"])
        if r["max_uses"] and r["uses"] >= r["max_uses"] and state_word == "valid":
            state_word = "used up"
        console.print(f"{r['id']:<12} {state_word:<8} uses {uses:<11} created {created}  expires {expires}  "
                      f"{r['description']}", highlight=False)


@token_app.command("revoke")
def token_revoke(token_id: Annotated[str, typer.Argument(help="The token's id (`farm head token list`).")],
                 state: StateDir = None) -> None:
    """Revoke a join token: agents can no longer join with it (nodes that joined stay). The Ray token, which every
    joined machine was given, is replaced too at the head's next start."""
    from farm.head.auth import rotate_ray_token

    store = _token_store(state)
    try:
        store.revoke_join_token(token_id)
    finally:
        store.close()
    rotate_ray_token(state_dir(state) / "ray.token")
    console.print(f"join token {token_id} revoked; {RAY_TOKEN_NEXT}", highlight=False)


RAY_TOKEN_NEXT = ("a new Ray token takes effect when the head starts again (`farm head stop`, then start): until "
                  "then the old one still joins Ray's cluster. Agents take the new one by themselves (their Ray "
                  "nodes exit with the old cluster, and they register again)")


@token_app.command("rotate-ray")
def token_rotate_ray(state: StateDir = None) -> None:
    """Replace the Ray token, which every machine that ever joined was given (Ray's cluster is one trust domain:
    its holder can run code on every node): at the head's next start."""
    from farm.head.auth import rotate_ray_token

    _token_store(state).close()  # a state folder with a head's state, not a typo
    rotate_ray_token(state_dir(state) / "ray.token")
    console.print(RAY_TOKEN_NEXT, highlight=False)
