"""`farm agent start|stop|install|uninstall|status`."""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from farm.cli.options import Json, StateDir, state_dir
from farm.cli.render import console, errors
from farm.core.errors import UserError
from farm.core.models import BackendName
from farm.local import python_command, read_json, recorded_alive, spawn_detached, terminate, wait_for, write_private

if TYPE_CHECKING:
    from farm_agent.daemon.service import Plan
    from farm_agent.daemon.settings import AgentSettings

app = typer.Typer(help="Run a node agent that offers this machine to a head.", no_args_is_help=True)


CaHash = Annotated[str | None, typer.Option(
    help="sha256:<hex> of the head's CA certificate, from the join line: the agent fetches the CA from the head, "
         "checks it against this, and trusts only it from then on.")]
CaFile = Annotated[Path | None, typer.Option("--ca", help="The head's CA certificate (PEM), instead of fetching it.")]
Insecure = Annotated[bool, typer.Option("--insecure", help="No TLS: for a head started with --insecure.")]
RayUser = Annotated[str | None, typer.Option(
    help="The user this node's Ray, and so every job's code, runs as. Default: $FARM_RAY_USER, else farm-ray (made "
         "if missing) for an agent run as root; `root` accepts that job code runs as the agent's user and can read "
         "its tokens and keys.")]


def agent_dir(state: Path, name: str) -> Path:
    return state / "agents" / name


@app.command()
def start(
    head: Annotated[str | None, typer.Option(
        help="HOST:PORT of the head (default: the head this node joined before).")] = None,
    token: Annotated[str | None, typer.Option(
        help="The join token (shows in `ps`: prefer FARM_JOIN_TOKEN, as the join line does, or --token-file). "
             "A node that joined before joins again on its own credentials, without one.")
    ] = None,
    token_file: Annotated[Path | None, typer.Option(
        help="Read the join token from this file (- for standard input); else from $FARM_JOIN_TOKEN.")] = None,
    name: Annotated[str | None, typer.Option(help="Node name (default: the host name).")] = None,
    cpus: Annotated[int | None, typer.Option(help="CPU cores to offer (default: all).", min=1)] = None,
    max_foreign_cpu: Annotated[float, typer.Option(
        help="Take no new shards while the owner's processes use more than this share of the CPU (percent; "
             "100 turns the rule off, as for several agents on one host).", min=1, max=100)] = 90.0,
    backends: Annotated[str | None, typer.Option(
        help="Comma-separated backends to lend, e.g. `cuda` (default: every one this machine runs).")] = None,
    drain_grace_s: Annotated[float, typer.Option(
        help="Once the owner has been busy this long (seconds), stop the Ray node: shards still running here go "
             "back to the queue. It starts again when the owner is idle.", min=0)] = 60.0,
    busy_file: Annotated[Path | None, typer.Option(
        help="While this file exists the node counts as busy (its first line is the reason): take the machine "
             "back by hand.")] = None,
    keep_warm_s: Annotated[float, typer.Option(
        help="How long a device keeps a warm worker (torch imported, the device ready: seconds a job's first shard "
             "would wait) after its last shard, and a GPU after the agent starts; 0: none.", min=0)] = 600.0,
    ca_hash: CaHash = None,
    ca: CaFile = None,
    insecure: Insecure = False,
    ray_user: RayUser = None,
    state: StateDir = None,
    detach: Annotated[bool, typer.Option(
        "--detach", help="Run in the background; return once the node is ready.")] = False,
    trusted: Annotated[bool, typer.Option(
        "--trusted", help="This machine is the head operator's own: it joins the head's Ray too (training runs "
        "only on trusted nodes). Needs the head's API token (FARM_TOKEN, or the local head's).")] = False,
) -> None:
    """Register this machine with a head and run shards for it. Started again (after a stop, a reboot), a node
    that joined before needs neither --head nor the join token: it joins its head again on its own credentials."""
    from farm.ray_user import chosen as chosen_ray_user
    from farm_agent.daemon.main import private_state_dir, ray_account, serve
    from farm_agent.daemon.settings import AgentSettings

    name = name or socket.gethostname()
    joined = read_json(agent_dir(state_dir(state), name) / "node.json") or {}
    head = head or joined.get("head")
    if not head:
        raise UserError(f"--head HOST:PORT is needed: agent {name!r} has not joined a head from "
                        f"{agent_dir(state_dir(state), name)}")
    if ":" not in head:
        raise UserError(f"--head {head!r}: expected HOST:PORT")
    # The node's own credentials, from its last Register: for the head they came from (an older node.json names
    # none: then they are tried, and the head says whether they hold).
    rejoining = bool(joined.get("node_id") and joined.get("node_token")) and joined.get("head", head) == head
    join_token = _join_token(token, token_file, required=not rejoining)
    settings = AgentSettings(
        head=head, token=join_token, name=name, state_dir=agent_dir(state_dir(state), name),
        cpus=cpus or os.cpu_count() or 1,
        max_foreign_cpu=max_foreign_cpu, backends=_lent_backends(backends), drain_grace_s=drain_grace_s,
        busy_file=busy_file.expanduser().resolve() if busy_file else None, ca_hash=ca_hash or "", insecure=insecure,
        keep_warm_s=keep_warm_s,
        ray_user=chosen_ray_user(ray_user), trusted=trusted, admin_token=_admin_token(state) if trusted else "",
    )
    status = read_json(settings.status_path)
    if recorded_alive(status):
        raise UserError(f"agent {name!r} is already running (pid {status['pid']})")
    private_state_dir(settings.state_dir)  # before any token is written into it
    ray_account(settings)  # before detaching: a Ray user that cannot reach this Python is one line here, exit 2
    _trust_head(settings, ca)  # before detaching: a CA that does not match --ca-hash is one line here, exit 2
    _warn_if_on_command_line(token)
    if detach:
        _start_detached(settings)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(settings)


def _admin_token(state: Path | None) -> str:
    """A trusted node's proof: the head's API token, from FARM_TOKEN or the local head's head.json."""
    found = os.environ.get("FARM_TOKEN", "").strip() or str((read_json(state_dir(state) / "head.json") or {})
                                                            .get("api_token", ""))
    if not found:
        raise UserError("--trusted needs the head's API token: set FARM_TOKEN (only the head's operator has it)")
    return found


def _warn_if_on_command_line(token: str | None) -> None:
    """Once the command's input checked out: a join token given with --token is in `ps` for every local user."""
    if token is not None:
        errors.print(f"warning: --token shows in `ps` to every user of this machine; give it with {JOIN_TOKEN_ENV}="
                     "... or --token-file", style="yellow", highlight=False)


def _lent_backends(backends: str | None) -> frozenset[BackendName] | None:
    if backends is None:
        return None
    names = [b.strip() for b in backends.split(",") if b.strip()]
    unknown = [b for b in names if b not in set(BackendName)]
    if unknown or not names:
        raise UserError(f"--backends {backends!r}: expected a comma-separated list of {', '.join(BackendName)}")
    return frozenset(BackendName(b) for b in names)


def _trust_head(settings: AgentSettings, ca: Path | None) -> None:
    """Pin the head's CA (kept in the agent's folder) now, in the foreground."""
    from farm.tls_pin import ca_hash, parse_ca_hash
    from farm_agent.daemon.client import pin_head_ca

    if settings.insecure and (settings.ca_hash or ca):
        raise UserError("--insecure trusts no CA: give it without --ca-hash and --ca")
    if ca is not None:
        try:
            pem = ca.read_bytes()
            found = ca_hash(pem)
        except (OSError, ValueError) as exc:
            raise UserError(f"--ca {ca}: not a readable PEM certificate ({exc})") from None
        if settings.ca_hash and found != parse_ca_hash(settings.ca_hash):
            raise UserError(f"--ca {ca} is {found}, not --ca-hash {settings.ca_hash}")
        write_private(settings.ca_path, pem)
    elif not (settings.insecure or settings.ca_hash or settings.ca_path.exists()):
        _trust_local_head(settings)
    pin_head_ca(settings)


def _trust_local_head(settings: AgentSettings) -> None:
    """An agent started on the head's own machine, from the head's state folder, for that head (`farm demo`, the
    tests): the head's CA file there is as trustworthy as a pin, so it is taken without --ca-hash."""
    root = settings.state_dir.parent.parent  # <state>/agents/<name>
    info = read_json(root / "head.json") or {}
    if info.get("address") == settings.head and info.get("tls") and info.get("ca"):
        try:
            write_private(settings.ca_path, Path(info["ca"]).read_bytes())
        except OSError:
            pass  # then --ca-hash is needed, as for any other head


JOIN_TOKEN_ENV = "FARM_JOIN_TOKEN"


def _join_token(token: str | None, token_file: Path | None, required: bool = True) -> str:
    """The join token: from --token-file (`-`: standard input), FARM_JOIN_TOKEN or --token, which every user of
    this machine can read in `ps` (and, with the Ray token it gets, would be a lender of its own). Not `required`
    (a node joining again on its own credentials): "" when none is given."""
    if token is None and token_file is None and os.environ.get(JOIN_TOKEN_ENV, "").strip():
        return os.environ[JOIN_TOKEN_ENV].strip()
    if token is None and token_file is None and not required:
        return ""
    if (token is None) == (token_file is None):
        raise UserError(f"give the join token with exactly one of --token and --token-file (- reads standard "
                        f"input), or as {JOIN_TOKEN_ENV}=TOKEN")
    if token is not None:
        return token
    assert token_file is not None  # exactly one of the two, checked above
    try:
        read = sys.stdin.read().strip() if str(token_file) == "-" else token_file.read_text().strip()
    except OSError as exc:
        raise UserError(f"--token-file {token_file}: {exc.strerror}") from None
    if not read:
        raise UserError(f"--token-file {token_file} is empty")
    return read


def _start_detached(settings: AgentSettings) -> None:
    """Run the daemon through its lean entry point (`python -m farm_agent`: no typer, rich or CLI resident in a
    process that lives for days) in its own session; return once its node is ready. If it dies or never gets ready,
    stop it and say why with the last line of its log."""
    settings.status_path.unlink(missing_ok=True)
    log = settings.state_dir / "agent.log"
    token_file = settings.state_dir / "join.token"  # 0600; on the command line the token would show in `ps`
    if settings.token:
        write_private(token_file, settings.token.encode())
    admin_file = settings.state_dir / "admin.token"  # read and removed by the daemon at its first Register
    if settings.admin_token:
        write_private(admin_file, settings.admin_token.encode())
    proc = spawn_detached(python_command(  # --option=value: a value may start with "-"
        "farm_agent", f"--head={settings.head}", *([f"--token-file={token_file}"] if settings.token else []),
        *([f"--ca-hash={settings.ca_hash}"] if settings.ca_hash else []),
        *(["--insecure"] if settings.insecure else []),
        f"--name={settings.name}", f"--state-dir={settings.state_dir}", f"--cpus={settings.cpus}",
        f"--max-foreign-cpu={settings.max_foreign_cpu}",
        *([f"--backends={','.join(sorted(settings.backends))}"] if settings.backends is not None else []),
        f"--drain-grace-s={settings.drain_grace_s}", f"--keep-warm-s={settings.keep_warm_s}",
        *([f"--busy-file={settings.busy_file}"] if settings.busy_file else []),
        f"--ray-user={settings.ray_user or ''}",  # as chosen here ('': the agent's own)
        *(["--trusted"] if settings.trusted else []),
        *([f"--admin-token-file={admin_file}"] if settings.admin_token else []),
    ), log, env={k: v for k, v in os.environ.items() if k != JOIN_TOKEN_ENV})  # the daemon reads its token file

    def ready() -> bool:  # a node drained by an operator, or whose owner is busy, has joined all the same
        return (read_json(settings.status_path) or {}).get("state") in ("ready", "draining")

    wait_for(lambda: proc.poll() is not None or ready(), timeout=120)
    if proc.poll() is not None or not ready():
        if proc.poll() is None:
            terminate(proc.pid)
        last = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
        raise UserError(
            f"agent {settings.name!r} did not become ready: {last[0] if last else 'no output'} (log: {log})")
    status = read_json(settings.status_path) or {}
    console.print(f"agent {settings.name} running (pid {proc.pid}) as node {status.get('node_id')}; log in {log}")


@app.command()
def stop(
    name: Annotated[str | None, typer.Option(help="Stop only this agent (default: every local agent).")] = None,
    state: StateDir = None,
) -> None:
    """Stop local agents: their shards are rescheduled elsewhere, their Ray nodes stop."""
    root = state_dir(state) / "agents"
    paths = [agent_dir(state_dir(state), name) / "agent.json"] if name else sorted(root.glob("*/agent.json"))
    running = [(p, s) for p in paths if recorded_alive(s := read_json(p))]
    if not running:
        raise UserError(f"no agent{' ' + repr(name) if name else ''} running from {root}")
    terminate(*[int(status["pid"]) for _, status in running])
    for _, status in running:
        console.print(f"agent {status['name']} (pid {status['pid']}) stopped")


User = Annotated[bool, typer.Option(
    "--user", help="A per-user service (systemd --user, a LaunchAgent) rather than a system one (which needs root).")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print what would be written and run; change nothing.")]


@app.command()
def install(
    head: Annotated[str, typer.Option(help="HOST:PORT of the head.")],
    token: Annotated[str | None, typer.Option(
        help="The join token (shows in `ps`: prefer FARM_JOIN_TOKEN or --token-file).")] = None,
    token_file: Annotated[Path | None, typer.Option(
        help="Read the join token from this file (- for standard input); else from $FARM_JOIN_TOKEN.")] = None,
    name: Annotated[str | None, typer.Option(help="Node name (default: the host name).")] = None,
    cpus: Annotated[int | None, typer.Option(help="CPU cores to offer (default: all).", min=1)] = None,
    ca_hash: CaHash = None,
    insecure: Insecure = False,
    user: User = False,
    run_as: Annotated[str | None, typer.Option(
        help="A system service: run the agent as this user rather than root. It cannot then run its Ray as another "
             "user: job code runs as this user, able to read the agent's tokens and keys.")] = None,
    ray_user: RayUser = None,
    state: StateDir = None,
    dry_run: DryRun = False,
) -> None:
    """Install the agent as a service that starts at boot and restarts on failure (systemd on Linux, launchd on
    macOS). The join token goes to a 0600 file in the agent's state folder, never into the service file. A system
    service runs the agent as root and its Ray, and so every job's code, as the unprivileged --ray-user (farm-ray,
    made here if missing)."""
    import getpass
    import pwd

    from farm import ray_user as ray_users
    from farm_agent.daemon import service

    join_token = _join_token(token, token_file)
    if ":" not in head:
        raise UserError(f"--head {head!r}: expected HOST:PORT")
    if bool(ca_hash) == insecure:
        raise UserError("give exactly one of --ca-hash (from the join line) and --insecure (a head without TLS)")
    if ca_hash:
        from farm.tls_pin import parse_ca_hash

        ca_hash = parse_ca_hash(ca_hash)
    if not user and not dry_run and os.geteuid() != 0:
        raise UserError("a system service needs root: run it with sudo, or install a per-user service with --user")
    if user and run_as:
        raise UserError("--run-as is for a system service: a per-user one (--user) runs as its user")
    root = state_dir(state)
    if run_as is not None:
        try:
            pwd.getpwnam(run_as)
        except KeyError:
            raise UserError(f"--run-as {run_as!r}: no such user") from None
    if state is None and run_as and run_as != getpass.getuser() and "FARM_STATE_DIR" not in os.environ:
        root = Path(pwd.getpwnam(run_as).pw_dir) / ".farm"
    farm = Path(sys.executable).parent / "farm"  # this environment's own farm: the service must not find another
    if not farm.exists():
        raise UserError(f"no farm executable next to {sys.executable}: install Farm into a virtual environment")
    asked = ray_user if ray_user is not None else os.environ.get("FARM_RAY_USER")  # kept in the service's command
    agent = service.AgentService(farm=farm, head=head, name=name or socket.gethostname(), state_dir=root, cpus=cpus,
                                 user_scope=user, run_as=None if run_as == "root" else run_as, ca_hash=ca_hash or "",
                                 insecure=insecure, ray_user=asked)
    agent_as_root = (run_as in (None, "root")) if not user else os.geteuid() == 0
    chosen = (ray_users.DEFAULT if asked is None else asked) if agent_as_root else ""
    if chosen not in ("", "root") and not dry_run:  # the service's agent will run its Ray as this user: made now
        from farm_agent.daemon.main import worker_packages

        ray_users.check_reachable(ray_users.ensure(chosen), worker_packages())
    platform = _service_platform()
    _carry_out(service.install_plan(agent, join_token, platform, Path.home(), os.getuid()), dry_run)
    _warn_if_on_command_line(token)
    if not dry_run:
        logs = f"journalctl{' --user' if user else ''} -u farm-agent" if platform == "linux" else str(agent.log_path)
        console.print(f"agent {agent.name} installed as a service ({service.service_path(platform, user, Path.home())})"
                      f"; its log: {logs}", highlight=False)


@app.command()
def uninstall(user: User = False, dry_run: DryRun = False) -> None:
    """Stop the agent's service and remove it and its token file (the node's identity stays)."""
    from farm_agent.daemon import service

    platform = _service_platform()
    path = service.service_path(platform, user, Path.home())
    if not path.exists():
        raise UserError(f"no agent service installed at {path}{'' if user else ' (a per-user one? try --user)'}")
    _carry_out(service.uninstall_plan(platform, user, Path.home(), os.getuid()), dry_run)
    if not dry_run:
        console.print(f"agent service removed ({path})", highlight=False)


@app.command()
def status(user: Annotated[bool, typer.Option("--user", help="Only the per-user service.")] = False,
           state: StateDir = None, as_json: Json = False) -> None:
    """Whether the agent's service is installed, enabled and running, and what its agent reports; and the agents
    started by hand from the state folder: running or not, pid, head, node id."""
    import json

    from farm_agent.daemon import service

    platform = _service_platform()
    found = [service.query(platform, scope, Path.home(), os.getuid()) for scope in ([True] if user else [False, True])]
    shown = next((f for f in found if f["installed"]), found[0])
    by_hand = [a for a in service.local_agents(state_dir(state)) if a["name"] != shown.get("name")]
    if as_json:
        print(json.dumps({**shown, "by_hand": by_hand}, indent=2))
        return
    if not shown["installed"]:
        console.print(f"agent service not installed ({' nor '.join(f['service_file'] for f in found)})",
                      highlight=False)
    else:
        console.print(
            f"service {shown['service_file']}: {'enabled' if shown['enabled'] else 'disabled'}, "
            f"{shown.get('service_state', 'unknown')}\n"
            f"agent {shown['name']} -> head {shown['head']}, cpus {shown['cpus']}, node {shown.get('node_id') or '-'}:"
            f" {_running(shown.get('agent'))}", highlight=False)
    for agent in by_hand:
        console.print(f"agent {agent['name']} (not a service) -> head {agent['head'] or '-'}, node "
                      f"{agent['node_id'] or '-'}: {_running(agent['running'])}", highlight=False, soft_wrap=True)


def _running(agent: dict[str, object] | None) -> str:
    if not agent:
        return "not running"
    return f"{agent.get('state')} (pid {agent.get('pid')})" + (f", owner busy: {agent['busy']}" if agent.get("busy")
                                                              else "")


def _service_platform() -> Literal["linux", "darwin"]:
    from farm_agent.daemon.service import current_platform

    try:
        return current_platform()
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _carry_out(plan: Plan, dry_run: bool) -> None:
    from farm_agent.daemon.service import apply, describe

    if dry_run:
        print("\n".join(describe(plan)))
        return
    try:
        warnings = apply(plan)
    except (RuntimeError, OSError) as exc:
        raise UserError(str(exc)) from None
    for warning in warnings:
        console.print(f"warning: {warning}", highlight=False)
