"""The head's settings, built once at the entry point and passed down."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from farm.local import ray_temp_dir


class HeadSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    state_dir: Path
    host: str = "0.0.0.0"  # where the gRPC control plane listens
    port: int = Field(default=7700, ge=1, le=65535)
    advertise: str = "127.0.0.1"  # the address agents and Ray nodes use to reach this head
    ray_port: int = Field(default=7701, ge=1, le=65535)
    # How often agents beat (told in RegisterReply). FARM_HEARTBEAT_INTERVAL_S sets it for a whole head process,
    # as benchmarks/control_plane.py does for its 1 s beats.
    heartbeat_interval_s: float = Field(
        default_factory=lambda: float(os.environ.get("FARM_HEARTBEAT_INTERVAL_S", "2.0")), gt=0
    )
    offline_after_s: float = Field(default=10.0, gt=0)  # silence after which a node counts as offline
    heartbeat_save_s: float = Field(default=2.0, gt=0)  # how often the latest heartbeats are written to the store
    max_attempts: int = Field(default=3, ge=1)  # tries per shard when nodes or workers die under it
    # Shards a device's worker holds queued behind the ones its slots run, of the job it runs: the next one is there
    # when one ends. FARM_QUEUE_DEPTH sets it for a head process (0: none, as benchmarks/gpu/workers.py compares).
    queue_depth: int = Field(default_factory=lambda: int(os.environ.get("FARM_QUEUE_DEPTH", "1")), ge=0, le=8)
    object_store_mb: int = Field(default=512, ge=100)
    max_code_mb: int = Field(default=100, ge=1)
    max_unzipped_code_mb: int = Field(default=400, ge=1)  # what the code may unpack to, all files together
    output_root: Path | None = None  # jobs' outputs only under it, when given (farm.head.output_place)
    # Security. TLS is on unless `insecure` (for a head behind something that terminates TLS for it); joined agents
    # beat over mutual TLS on `mtls_port` (default: port + 3), where the head asks every client for a certificate.
    insecure: bool = False
    mtls_port: int | None = Field(default=None, ge=1, le=65535)
    # The DataService again on a port of its own (default: port + 4), served by `data_lanes` servers each on a
    # thread of its own (farm.head.data_lanes): a node reads a large file on several connections, sent by several
    # cores. 0 lanes: nodes read on the main port only.
    data_port: int | None = Field(default=None, ge=1, le=65535)
    data_lanes: int = Field(default_factory=lambda: min(8, os.cpu_count() or 1), ge=0, le=64)
    # Where nodes read ranges of large files over plain TLS connections (farm.head.bulk; default: port + 5), beside
    # the data lanes; served while there are data lanes.
    bulk_port: int | None = Field(default=None, ge=1, le=65535)
    tls_names: tuple[str, ...] = ()  # more names for the server certificate (a Service's DNS name, a public IP)
    open_read: bool = False  # listing nodes and jobs, a job, its logs: without the API token
    auth_failures_allowed: int = Field(default=20, ge=1)  # per peer address within auth_block_s, then refused ...
    auth_block_s: float = Field(default=60.0, gt=0)  # ... unchecked for this long
    # New nodes one join token may let in per minute (farm.head.auth.JoinRateLimiter; 0: no limit): a leaked token
    # cannot flood the fleet, while a rollout of many machines waits a minute now and then. `farm head start
    # --join-rate`.
    join_rate_per_min: int = Field(default=30, ge=0, le=10_000)
    # Peers on this machine (127.0.0.0/8, ::1) are not limited: guessing a 192-bit token is hopeless anyway, and the
    # limit is against the network; a local script or test that fails often must not lock out the local CLI.
    limit_loopback: bool = False
    # Ray's own ports on the head, pinned when given (a firewall lets through only these); else Ray picks.
    ray_node_manager_port: int | None = Field(default=None, ge=1, le=65535)
    ray_object_manager_port: int | None = Field(default=None, ge=1, le=65535)
    ray_min_worker_port: int | None = Field(default=None, ge=1, le=65535)
    ray_max_worker_port: int | None = Field(default=None, ge=1, le=65535)
    # The account the head's Ray node runs as (farm.ray_user.chosen: farm-ray for a head running as root); None: the
    # head's own user.
    ray_user: str | None = None

    @property
    def address(self) -> str:
        return f"{self.advertise}:{self.port}"

    @property
    def ray_address(self) -> str:
        return f"{self.advertise}:{self.ray_port}"

    @property
    def mtls_listen_port(self) -> int:
        return self.mtls_port or self.port + 3

    @property
    def data_listen_port(self) -> int:
        return self.data_port or self.port + 4

    @property
    def bulk_listen_port(self) -> int:
        return self.bulk_port or self.port + 5

    @property
    def own_ports(self) -> frozenset[int]:
        """The ports the head binds itself, some only after Ray starts: a port picked for anything else avoids them."""
        return frozenset({self.port, self.ray_port, self.mtls_listen_port, self.data_listen_port,
                          self.bulk_listen_port})

    @property
    def bulk_address(self) -> str:
        """Where nodes read ranges of large files ("" without data lanes: through the DataService)."""
        return f"{self.advertise}:{self.bulk_listen_port}" if self.data_lanes else ""

    @property
    def data_address(self) -> str:
        """Where nodes read a job's data in bulk ("" without data lanes: the main address)."""
        return f"{self.advertise}:{self.data_listen_port}" if self.data_lanes else ""

    @property
    def tls_dir(self) -> Path:
        return self.state_dir / "tls"

    @property
    def info_path(self) -> Path:
        return self.state_dir / "head.json"

    @property
    def ray_token_path(self) -> Path:
        return self.state_dir / "ray.token"

    @property
    def ray_record_path(self) -> Path:
        """The running Ray head's processes (farm.local.record_session): cleared at the next start if the head
        was killed outright."""
        return self.state_dir / "ray-head.json"

    @property
    def ray_temp_dir(self) -> Path:
        """The head's own Ray folder (not /tmp/ray, which every Ray on the host shares), one per state folder.
        Short: Ray's socket paths under it must fit in 107 bytes."""
        return ray_temp_dir("head-" + hashlib.sha256(str(self.state_dir.resolve()).encode()).hexdigest()[:10])
