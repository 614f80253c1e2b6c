"""The agent's settings, built once at the entry point and passed down."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from farm.core.models import BackendName


class AgentSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    head: str  # HOST:PORT of the head's gRPC endpoint
    # The join token; "" for a node that joined before, which joins again on its own credentials (node.json, and
    # with TLS its certificate node.pem) that the head gave it.
    token: str = Field(default="", repr=False)
    # How the agent trusts the head: the hash of the head's CA (pinned at the first join, then kept as ca.pem in
    # the state folder), or nothing at all for a head started with --insecure.
    ca_hash: str = ""
    insecure: bool = False
    name: str
    state_dir: Path  # this agent's own folder: agents/<name>/ under the Farm state directory
    cpus: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    object_store_mb: int = Field(default=1024, ge=100)
    # The idle policy (farm_agent.daemon.idle): the owner's share of the machine's CPU above which the node takes no
    # work.
    max_foreign_cpu: float = Field(default=90.0, gt=0, le=100)
    # Once the owner has been busy this long, the agent stops its Ray node: shards still running there go back to
    # the head's queue. It starts the node again when the owner is idle.
    drain_grace_s: float = Field(default=60.0, ge=0)
    # While this file exists the idle policy says busy (its first line, if any, is the reason): an operator's way to
    # take a machine back by hand, and the tests' way to make an owner busy.
    busy_file: Path | None = None
    # The backends the owner lends (None: every one this machine can run), e.g. only the GPU of a workstation.
    backends: frozenset[BackendName] | None = None
    # The account the node's Ray (and so every job's code) runs as (farm.ray_user.chosen: farm-ray for an agent run
    # as root); None: the agent's own, which job code can then read the agent's tokens and keys as.
    ray_user: str | None = None
    # A trusted node (the head operator's own machine): it registers with the head's API token and joins the head's
    # Ray cluster too (training). Without it the node never learns the head's Ray address or token.
    trusted: bool = False
    admin_token: str = Field(default="", repr=False)  # the API token, for a trusted node's Register only
    # How long a device keeps a warm worker (torch imported, the device ready) for its next job after its last
    # shard ended, and a GPU after the agent's start (farm_agent.daemon.workers); 0: none, every job starts its own.
    keep_warm_s: float = Field(default=600.0, ge=0)

    @property
    def ray_token_path(self) -> Path:
        return self.state_dir / "ray.token"

    @property
    def status_path(self) -> Path:
        return self.state_dir / "agent.json"

    @property
    def ca_path(self) -> Path:
        return self.state_dir / "ca.pem"

    @property
    def identity_path(self) -> Path:
        return self.state_dir / "node.json"
