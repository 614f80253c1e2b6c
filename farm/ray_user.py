"""The account Farm's Ray nodes run as. Ray's cluster is one trust domain: whoever holds its token can run code on any
of its nodes, the head's own included (a task pinned there needs no resources). So a Ray node never runs as root:
a head or agent running as root starts its Ray node as a dedicated unprivileged user (created here when missing), in
a private folder of that user's, with its own copy of the Ray token, and job code on it cannot read the head's or
the agent's state folders (0700, root's): their tokens and keys."""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from farm import switch_user
from farm.core.errors import UserError

DEFAULT = "farm-ray"


def chosen(asked: str | None) -> str | None:
    """The user a Ray node runs as: `asked` (the --ray-user option or FARM_RAY_USER), else DEFAULT for a process
    running as root; None keeps this process's own user (asked "root" by name, or not root already)."""
    name = asked if asked is not None else os.environ.get("FARM_RAY_USER")
    if name is None:
        name = DEFAULT if os.geteuid() == 0 else ""
    return None if name in ("", "root") or os.geteuid() != 0 else name


def ensure(name: str) -> pwd.struct_passwd:
    """The account `name`, made as a system user without a home or a login shell if missing (Linux: useradd)."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    if sys.platform != "linux" or shutil.which("useradd") is None:
        raise UserError(f"no user {name!r} to run Ray as: create it, or choose one with --ray-user")
    made = subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell",
                           "/usr/sbin/nologin", "--user-group", name], capture_output=True, text=True, check=False)
    if made.returncode != 0 and made.returncode != 9:  # 9: made meanwhile by another start
        raise UserError(f"cannot create the user {name!r} to run Ray as: {made.stderr.strip()}")
    return pwd.getpwnam(name)


class Closed(NamedTuple):
    """What a Ray process needs that `user` cannot reach, and where it is stopped."""

    target: Path  # the interpreter, a library's folder, a package's
    folder: Path  # the first folder on the way it may not pass through, or may not list where Python must
    listed: bool  # whether Python lists `folder` (an import root or a package): then read and execute, else execute


def check_reachable(user: pwd.struct_passwd, packages: Sequence[Path] = ()) -> None:
    """The Python environment Ray's processes start from (and `packages`: what they import, Farm's own packages on an
    agent, whose workers run shards) must be readable by `user`: else a clear line, not a Ray that dies at start or
    a shard that fails on its first import."""
    closed = first_closed(user, packages)
    if closed is not None:
        mode = "rx" if closed.listed else "x"
        raise UserError(
            f"job code runs as {user.pw_name!r} (never as root), who cannot reach {closed.target}: {closed.folder} is "
            f"private. Run ./scripts/setup as root once (it lets {user.pw_name} pass through, by an ACL for it "
            f"alone), or `setfacl -m u:{user.pw_name}:{mode} {closed.folder}`, or install Farm where {user.pw_name} "
            "can read it")


def first_closed(user: pwd.struct_passwd, packages: Sequence[Path] = ()) -> Closed | None:
    """What Ray's processes need (the interpreter, the standard library, Ray's package, `packages`) and the first
    folder on the way to it that `user` cannot enter; None if it can reach them all. Python lists the folders it
    imports from (each sys.path entry: a checkout's root is one) and the packages' own, so those it must also be
    able to list: a checkout cloned into a 0700 folder, passable only, imported nothing of Farm's."""
    ray_package = importlib.util.find_spec("ray")
    ray_folder = Path(ray_package.origin).parent if ray_package and ray_package.origin else Path(sys.prefix)
    stdlib = Path(shutil.__file__).resolve().parent
    # The interpreter as started (a venv's bin/, whose pyvenv.cfg and site-packages it reads) and as it is.
    needs: list[tuple[Path, set[Path]]] = [(Path(sys.executable), set()), (Path(sys.executable).resolve(), set()),
                                           (stdlib, {stdlib})]
    for package in (ray_folder, *(p.resolve() for p in packages)):
        needs.append((package, {package, package.parent}))
    for target, listed in needs:
        blocked = _first_closed(target, user, listed)
        if blocked is not None:
            return Closed(target, blocked, blocked in listed)
    return None


def _first_closed(target: Path, user: pwd.struct_passwd, listed: set[Path]) -> Path | None:
    folders = [*reversed(target.parents), target]
    if os.geteuid() == 0:  # asked of the kernel as that user: ACLs and all
        return _first_closed_as(user, [f for f in folders if f.is_dir()], listed)
    for folder in folders:
        info = folder.stat()
        mode = info.st_mode
        if info.st_uid == user.pw_uid:
            bits = stat.S_IXUSR | (stat.S_IRUSR if folder in listed else 0)
        elif info.st_gid == user.pw_gid:
            bits = stat.S_IXGRP | (stat.S_IRGRP if folder in listed else 0)
        else:
            bits = stat.S_IXOTH | (stat.S_IROTH if folder in listed else 0)
        if stat.S_ISDIR(mode) and mode & bits != bits:
            return folder
    return None


def _first_closed_as(user: pwd.struct_passwd, folders: Sequence[Path], listed: set[Path]) -> Path | None:
    """The first of `folders` that `user` may not pass through (or list, those in `listed`), as the kernel answers a
    process that became that user (mode bits, ACLs, whatever else decides); only root can ask. A process of its own
    asks: this one is never forked (farm.switch_user says why)."""
    index = switch_user.first_closed_as(user, [str(folder) for folder in folders], [str(f) for f in listed])
    if index is None:
        raise UserError(f"cannot check what {user.pw_name!r} may reach")
    return folders[index] if index >= 0 else None


def grant_passage(user: pwd.struct_passwd, packages: Sequence[Path] = ()) -> list[Closed]:
    """Let `user` reach what its processes need (first_closed) where it may not: an ACL entry on each folder in the
    way for that user alone, execute only (`setfacl -m u:USER:x`) on a folder it only passes through, read and
    execute on one Python lists (an import root such as a checkout cloned into a 0700 folder), so it can reach this
    Python and Farm under a private home (pyenv or conda in /root, as on many GPU machines) without reading what is
    private there. What it opened, in order (a folder opened twice, once); a UserError where it cannot (no setfacl,
    or a filesystem without ACLs)."""
    opened: list[Closed] = []
    while (closed := first_closed(user, packages)) is not None:
        if closed in opened:
            raise UserError(f"an ACL on {closed.folder} did not let {user.pw_name!r} pass (does its filesystem keep "
                            "ACLs?)")
        if shutil.which("setfacl") is None:
            raise UserError(f"{user.pw_name!r} cannot reach {closed.target}: {closed.folder} is private, and setfacl "
                            "is not installed to let it pass (Debian/Ubuntu: apt-get install acl)")
        mode = "rx" if closed.listed else "x"
        done = subprocess.run(["setfacl", "-m", f"u:{user.pw_name}:{mode}", str(closed.folder)], capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            raise UserError(f"cannot let {user.pw_name!r} pass through {closed.folder}: {done.stderr.strip()}")
        opened.append(closed)
    return [c for i, c in enumerate(opened) if all(later.folder != c.folder for later in opened[i + 1:])]


def main() -> None:
    """`python -m farm.ray_user` (scripts/setup runs it as root): the account job code runs as, made if missing,
    and let through to this Python and Farm's packages."""
    if os.geteuid() != 0:
        return
    name = chosen(None)
    if name is None:
        return
    import farm

    extra = [Path(farm.__file__).parent]
    try:
        import farm_agent

        extra.append(Path(farm_agent.__file__).parent)
    except ImportError:
        pass
    try:
        user = ensure(name)
        for closed in grant_passage(user, extra):
            folder = closed.folder
            may = f"list and import from {folder}" if closed.listed else f"pass through {folder}, not list it"
            print(f"{name} (the account job code runs as) may now {may}: an ACL for it alone; undo with: setfacl -x "
                  f"u:{name} {closed.folder}")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def private_folder(path: Path, user: pwd.struct_passwd | None) -> Path:
    """A fresh folder for one Ray node, 0700, owned by `user` (None: this process's user): `path`, or where another
    user put something there (node ids are public: a link planted at /tmp/farm-ray-<node id> once kept an agent from
    starting) and this process may not remove it, a new folder of a random name beside it. What a previous run of
    ours left there (old sessions) is removed; nothing is followed through a link."""
    ours = {os.geteuid(), user.pw_uid if user is not None else os.geteuid()}
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        found = None
    if found is not None:
        if found.st_uid in ours or os.geteuid() == 0:  # ours, or root's to clear (a sticky /tmp lets root)
            if stat.S_ISDIR(found.st_mode):
                shutil.rmtree(path)  # never follows links inside (it works from directory descriptors)
            else:
                os.unlink(path)
        else:
            return _random_folder(path, user)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:  # someone made it in between
        return _random_folder(path, user)
    if user is not None:
        os.chown(path, user.pw_uid, user.pw_gid)
    return path


def _random_folder(path: Path, user: pwd.struct_passwd | None) -> Path:
    folder = Path(tempfile.mkdtemp(prefix=path.name + "-", dir=path.parent))  # 0700, a name nobody can guess
    if user is not None:
        os.chown(folder, user.pw_uid, user.pw_gid)
    return folder


def hand_token(token_path: Path, folder: Path, user: pwd.struct_passwd | None) -> Path:
    """A copy of the Ray token in the Ray node's own folder, readable by its user only: the node reads it there, and
    the token in the state folder stays unreadable to job code."""
    copy = folder / "ray.token"
    fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(token_path.read_bytes())
    if user is not None:
        os.chown(copy, user.pw_uid, user.pw_gid)
    return copy


if __name__ == "__main__":
    main()
