"""The agent as a service that starts at boot and restarts on failure: a systemd unit on Linux, a launchd job on macOS.

`farm agent install|uninstall|status` use this module. The first part is pure: it renders the service files from the
templates in agents/systemd/ and agents/launchd/ and plans what to write and run. The last part (`apply`, `query`)
carries out a plan or asks systemctl/launchctl: the only code here with side effects.

The join token never appears in a service file or on a command line (both are readable by every user, the latter
through `ps`): `install` writes it to a 0600 file in the agent's state folder, and the service runs
`farm agent start --token-file FILE`.
"""

from __future__ import annotations

import os
import plistlib
import pwd
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any, Literal

from farm.local import read_json, recorded_alive

Platform = Literal["linux", "darwin"]

SYSTEMD_UNIT = "farm-agent.service"
LAUNCHD_LABEL = "io.farm.agent"
TOKEN_FILE = "join.token"
# The agent's SIGTERM path: Ray drains for up to 30 s, its session is cleared in 5, then the agent deregisters.
STOP_TIMEOUT_S = 90


@dataclass(frozen=True)
class AgentService:
    """What the service runs: `farm agent start` in the foreground, as `run_as` (None: the service manager's user)."""

    farm: Path  # the farm executable of the virtual environment Farm is installed in
    head: str
    name: str
    state_dir: Path  # Farm's state folder; the agent keeps its own under agents/NAME
    cpus: int | None = None
    user_scope: bool = False  # a per-user service (systemd --user, a LaunchAgent) rather than a system one
    run_as: str | None = None  # system scope only: the account the agent runs as
    ca_hash: str = ""  # the head's CA hash (no secret): the agent pins the CA at its first start
    insecure: bool = False  # a head without TLS
    ray_user: str | None = None  # `--ray-user`, as asked at install (None: the agent's default, farm.ray_user.chosen)

    @property
    def agent_dir(self) -> Path:
        return self.state_dir / "agents" / self.name

    @property
    def token_file(self) -> Path:
        return self.agent_dir / TOKEN_FILE

    @property
    def log_path(self) -> Path:
        return self.agent_dir / "service.log"

    def command(self) -> list[str]:
        argv = [str(self.farm), "agent", "start", "--head", self.head, "--token-file", str(self.token_file),
                "--name", self.name, "--state-dir", str(self.state_dir)]
        argv += ["--ca-hash", self.ca_hash] if self.ca_hash else ["--insecure"] if self.insecure else []
        argv += ["--cpus", str(self.cpus)] if self.cpus else []
        return [*argv, "--ray-user", self.ray_user] if self.ray_user is not None else argv


@dataclass(frozen=True)
class Command:
    argv: list[str]
    check: bool = True  # False: a failure is expected at times (stopping what is not running) and is not an error


@dataclass(frozen=True)
class Plan:
    """Commands to run first, files to write (path, content, mode), files to remove, then commands, in this order."""

    before: list[Command] = field(default_factory=list)
    writes: list[tuple[Path, bytes, int]] = field(default_factory=list)
    removes: list[Path] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    secret_paths: frozenset[Path] = frozenset()  # written but never printed
    # Run as root for a system service that runs as someone else: the paths (the agent's folders and token) that
    # must belong to that account, which the agent reads and writes them as.
    owner: str | None = None
    owned: list[Path] = field(default_factory=list)


def current_platform() -> Platform:
    if sys.platform.startswith("linux"):
        return "linux"
    if sys.platform == "darwin":
        return "darwin"
    raise ValueError(f"no service manager Farm knows on {sys.platform} (systemd on Linux, launchd on macOS)")


def template(relative: str) -> str:
    """A service template: from the source tree (agents/), or from where the wheel installs it (PREFIX/share/farm)."""
    for root in (Path(__file__).resolve().parents[2], Path(sys.prefix) / "share" / "farm"):
        if (root / relative).is_file():
            return (root / relative).read_text()
    raise FileNotFoundError(f"service template {relative} is missing from this installation")


def systemd_quote(arg: str) -> str:
    """One ExecStart argument: systemd expands % specifiers and $ variables, and splits on blanks outside quotes."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and not re.search(r"[\s\"'\\;]", arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_systemd_unit(service: AgentService) -> str:
    user = "" if service.user_scope or not service.run_as else f"User={service.run_as}\n"
    # network-online.target is a system unit: a user manager cannot want it (ordering after it is harmless).
    wants = "" if service.user_scope else "Wants=network-online.target\n"
    return Template(template("systemd/farm-agent.service")).substitute(
        head=service.head, wants=wants, user=user, exec_start=" ".join(systemd_quote(a) for a in service.command()),
        stop_timeout_s=STOP_TIMEOUT_S, wanted_by="default.target" if service.user_scope else "multi-user.target",
    )


def render_launchd_plist(service: AgentService) -> bytes:
    job: dict[str, Any] = plistlib.loads(template("launchd/io.farm.agent.plist").encode())
    job.update(ProgramArguments=service.command(), StandardOutPath=str(service.log_path),
               StandardErrorPath=str(service.log_path), WorkingDirectory=str(service.agent_dir),
               ExitTimeOut=STOP_TIMEOUT_S)
    if not service.user_scope and service.run_as:
        job["UserName"] = service.run_as
    return plistlib.dumps(job)


def service_path(platform: Platform, user_scope: bool, home: Path) -> Path:
    if platform == "linux":
        return (home / ".config/systemd/user" if user_scope else Path("/etc/systemd/system")) / SYSTEMD_UNIT
    folder = home / "Library/LaunchAgents" if user_scope else Path("/Library/LaunchDaemons")
    return folder / f"{LAUNCHD_LABEL}.plist"


def launchd_domain(user_scope: bool, uid: int) -> str:
    return f"gui/{uid}" if user_scope else "system"


def systemctl(user_scope: bool, *args: str) -> list[str]:
    return ["systemctl", *(["--user"] if user_scope else []), *args]


def install_plan(service: AgentService, token: str, platform: Platform, home: Path, uid: int) -> Plan:
    """Write the token file and the service file, then (re)start the service: running it twice changes nothing, and
    a changed service file takes effect."""
    path = service_path(platform, service.user_scope, home)
    token_write = (service.token_file, token.strip().encode() + b"\n", 0o600)
    if platform == "linux":
        commands = [
            Command(systemctl(service.user_scope, "daemon-reload")),
            Command(systemctl(service.user_scope, "enable", SYSTEMD_UNIT)),
            Command(systemctl(service.user_scope, "restart", SYSTEMD_UNIT)),
        ]
        if service.user_scope:  # a user's services start at boot, not at their first login, only if they linger
            commands.append(Command(["loginctl", "enable-linger", pwd.getpwuid(uid).pw_name], check=False))
        writes = [token_write, (path, render_systemd_unit(service).encode(), 0o644)]
    else:
        domain = launchd_domain(service.user_scope, uid)
        commands = [
            Command(["launchctl", "bootout", f"{domain}/{LAUNCHD_LABEL}"], check=False),  # not loaded yet: fine
            Command(["launchctl", "bootstrap", domain, str(path)]),
        ]
        writes = [token_write, (path, render_launchd_plist(service), 0o644)]
    owner = None if service.user_scope else service.run_as
    owned = [service.state_dir, service.state_dir / "agents", service.agent_dir, service.token_file] if owner else []
    return Plan(writes=writes, commands=commands, secret_paths=frozenset({service.token_file}), owner=owner,
                owned=owned)


def installed_command(path: Path) -> list[str] | None:
    """The `farm agent start ...` an installed service file runs (None when there is none)."""
    if not path.is_file():
        return None
    if path.suffix == ".plist":
        return [str(a) for a in plistlib.loads(path.read_bytes()).get("ProgramArguments", [])]
    for line in path.read_text().splitlines():
        if line.startswith("ExecStart="):
            return [a.replace("$$", "$").replace("%%", "%") for a in shlex.split(line.removeprefix("ExecStart="))]
    return None


def option(argv: Sequence[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


def uninstall_plan(platform: Platform, user_scope: bool, home: Path, uid: int) -> Plan:
    """Stop and disable the service, remove its file and the token file it names; the agent's node identity stays,
    so that installing it again brings back the same node."""
    path = service_path(platform, user_scope, home)
    token_file = option(installed_command(path) or [], "--token-file")
    removes = [path, *([Path(token_file)] if token_file else [])]
    if platform == "linux":
        return Plan(before=[Command(systemctl(user_scope, "disable", "--now", SYSTEMD_UNIT), check=False)],
                    removes=removes, commands=[Command(systemctl(user_scope, "daemon-reload"))])
    return Plan(before=[Command(["launchctl", "bootout", f"{launchd_domain(user_scope, uid)}/{LAUNCHD_LABEL}"],
                                check=False)], removes=removes)


def describe(plan: Plan) -> list[str]:
    """What a plan does, as `--dry-run` prints it: every file with its content (the token's excepted), every command."""
    lines = [f"would run: {shlex.join(c.argv)}" for c in plan.before]
    for path, content, mode in plan.writes:
        shown = "(the join token, not shown)" if path in plan.secret_paths else content.decode()
        lines.append(f"would write {path} (mode {mode:04o}):\n{shown.rstrip()}")
    lines += [f"would remove {path}" for path in plan.removes]
    lines += [f"would run: {shlex.join(c.argv)}" for c in plan.commands]
    return lines


# --- side effects: the thin layer that carries out a plan and asks the service manager -----------------------------

Run = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def run_command(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def apply(plan: Plan, run: Run = run_command) -> list[str]:
    """Carry out a plan; return warnings (commands allowed to fail that did). Raises RuntimeError on a failure."""
    warnings = _run_all(plan.before, run)
    for path, content, mode in plan.writes:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        os.fchmod(fd, mode)  # before the content: a token is never readable by others, not even for a moment
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        tmp.replace(path)
    if plan.owner and os.geteuid() == 0:
        account = pwd.getpwnam(plan.owner)
        for path in plan.owned:
            os.chown(path, account.pw_uid, account.pw_gid)
    for path in plan.removes:
        path.unlink(missing_ok=True)
    return warnings + _run_all(plan.commands, run)


def _run_all(commands: list[Command], run: Run) -> list[str]:
    warnings = []
    for command in commands:
        try:
            done = run(command.argv)
        except FileNotFoundError:
            raise RuntimeError(f"{command.argv[0]} not found: is this a systemd/launchd system?") from None
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
            if command.check:
                raise RuntimeError(f"{shlex.join(command.argv)} failed: {why[0]}")
            warnings.append(f"{shlex.join(command.argv)}: {why[0]}")
    return warnings


def query(platform: Platform, user_scope: bool, home: Path, uid: int, run: Run = run_command) -> dict[str, Any]:
    """Whether the service is installed, enabled and active, and what its agent says of itself (its state files)."""
    path = service_path(platform, user_scope, home)
    argv = installed_command(path)
    found: dict[str, Any] = {"installed": argv is not None, "service_file": str(path), "enabled": False,
                             "active": False}
    if argv is None:
        return found
    try:
        if platform == "linux":
            enabled = run(systemctl(user_scope, "is-enabled", SYSTEMD_UNIT)).stdout.strip()
            active = run(systemctl(user_scope, "is-active", SYSTEMD_UNIT)).stdout.strip()
            found.update(enabled=enabled == "enabled", active=active == "active", service_state=active)
        else:
            printed = run(["launchctl", "print", f"{launchd_domain(user_scope, uid)}/{LAUNCHD_LABEL}"])
            state = re.search(r"^\s*state = (\S+)", printed.stdout, re.MULTILINE)
            found.update(enabled=printed.returncode == 0, active=bool(state and state.group(1) == "running"),
                         service_state=state.group(1) if state else "not loaded")
    except FileNotFoundError as exc:
        found["service_state"] = f"unknown ({exc.filename} not found)"
    name, state_dir = option(argv, "--name"), option(argv, "--state-dir")
    found.update(head=option(argv, "--head"), name=name, cpus=option(argv, "--cpus") or "all")
    if name and state_dir:
        agent = local_agent(Path(state_dir) / "agents" / name)
        found["agent"] = agent["running"]
        found["node_id"] = agent["node_id"]
    return found


def local_agent(agent_dir: Path) -> dict[str, Any]:
    """What an agent's state folder says of it, however it was started (a service, by hand): its name, the head and
    node it joined as (node.json, kept), and while it runs its own record (agent.json: pid, state, busy)."""
    running = read_json(agent_dir / "agent.json")  # written while the agent runs, removed when it stops
    joined = read_json(agent_dir / "node.json") or {}
    return {"name": agent_dir.name, "head": (running or {}).get("head") or joined.get("head"),
            "node_id": (running or {}).get("node_id") or joined.get("node_id"),
            "running": running if recorded_alive(running) else None}


def local_agents(state_dir: Path) -> list[dict[str, Any]]:
    """Every agent that joined or runs from this Farm state folder."""
    root = state_dir / "agents"
    folders = sorted({p.parent for p in (*root.glob("*/agent.json"), *root.glob("*/node.json"))})
    return [local_agent(folder) for folder in folders]
