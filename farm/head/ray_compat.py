"""The head's calls into Ray's private modules, in one place: Ray has no public API for either (checked on 2.60), and
ray==2.60.0 is pinned for them; tests/unit/test_ray_compat.py checks each on the installed Ray."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from farm.local import ray_env


def upload_code(data: bytes) -> str:
    """A job's zipped code as a Ray package URI, uploaded to the cluster's GCS unless a package of the same bytes is
    there already. Task-level runtime_envs take only URIs, not local paths (`ray.init(runtime_env=...)` uploads a
    whole driver's working_dir the same way, for one driver only)."""
    from ray._private.runtime_env import packaging

    uri = code_uri(data)
    if not packaging.package_exists(uri):
        packaging.upload_package_to_gcs(uri, data)
    return uri


def code_uri(data: bytes) -> str:
    """The package URI of a job's zipped code: one per content, whichever jobs share it."""
    return f"gcs://_ray_pkg_{hashlib.sha1(data).hexdigest()}.zip"


def drop_code(uri: str) -> None:
    """Remove a code package from the cluster's GCS. Ray frees a package once the driver that uploaded it ends, and
    the head's driver lives as long as the head: a deleted job's code would stay in the GCS's memory till then."""
    from ray.experimental.internal_kv import _internal_kv_del

    _internal_kv_del(uri)


def keep_loopback() -> None:
    """This process's Ray driver reaches a Ray head on loopback at 127.0.0.1, as farm.local.RAY_START_ON_LOOPBACK has
    its node keep it (Ray turns 127.0.0.1 into the machine's reachable address, where that head does not listen)."""
    from ray._private import services
    from ray._raylet import get_localhost_ip, is_localhost  # type: ignore[attr-defined]  # not in ray's _raylet.pyi

    services.resolve_ip_for_localhost = lambda host: get_localhost_ip() if is_localhost(host) else host


def use_ray_token(token_path: Path) -> None:
    """Point this process's Ray driver at Farm's token. Ray reads its auth settings once, when it is imported, so
    they are reloaded here after the environment names the token."""
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]  # not in ray's _raylet.pyi

    os.environ.update(ray_env(token_path))
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
