"""The agent's gRPC client for the head's AgentService, over TLS: the head's CA is pinned at the first join (its hash
is in the join line) and kept; once registered, Heartbeat and Deregister go over mutual TLS with the client
certificate the head signed for this node.

The daemon never imports `cryptography` (~15 MB resident for its whole life): the CA is pinned with the standard
library (farm.tls_pin), and the node's key and CSR are made by a short-lived child, `python -m farm_agent --csr
KEY_FILE`, which writes the key 0600 into the agent's own state folder (it never crosses a pipe) and prints only the
CSR."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from farm import __version__
from farm.core.errors import AgentError, AuthError, UserError
from farm.core.models import BackendOffer, Hardware
from farm.local import python_command, write_private
from farm.proto import convert
from farm.proto.v1 import agent_pb2, agent_pb2_grpc
from farm.tls_pin import ca_hash, fetch_ca, parse_ca_hash
from farm_agent.daemon.settings import AgentSettings


def pin_head_ca(settings: AgentSettings) -> bytes | None:
    """The head's CA certificate (PEM) this agent trusts; None for a head without TLS (--insecure). Fetched from the
    head and checked against --ca-hash at the first join, then kept in the state folder; a stored one that does not
    match a given --ca-hash is fetched again (a head with a new CA)."""
    if settings.insecure:
        return None
    wanted = parse_ca_hash(settings.ca_hash) if settings.ca_hash else ""
    if settings.ca_path.exists():
        stored = settings.ca_path.read_bytes()
        if not wanted or ca_hash(stored) == wanted:
            return stored
    if not wanted:
        raise UserError("the head's CA is not known yet: give --ca-hash (from the join line `farm head start` "
                        "printed), or --insecure for a head started with --insecure")
    pem = fetch_ca(settings.head, wanted)
    write_private(settings.ca_path, pem)
    return pem


def credentials(token: str, node_id: str = "") -> tuple[tuple[str, str], ...]:
    """The call's credential in its metadata too, where the head checks it before reading the call's body
    (farm.head.gate): the join token for Register, the node's token and id for the node's calls."""
    return (("authorization", f"Bearer {token}"), *((("farm-node-id", node_id),) if node_id else ()))


NODE_KEY_FILE = "node.key"  # in the agent's state folder: a new private key, until the head has certified it
# ... then the node's identity: that key and its client certificate in one file, replaced in one step, so that a
# machine killed at any moment keeps a key and certificate that match (its proof of being this node at Register).
NODE_IDENTITY_FILE = "node.pem"


async def new_node_key(key_path: Path) -> tuple[bytes, bytes]:
    """A new private key for this node, written 0600 to `key_path` by a child process, and a CSR for it (the head
    fills in the subject), as PEM. A child, because making them needs `cryptography`, which would otherwise stay
    resident in the daemon."""
    done = await asyncio.to_thread(
        subprocess.run, python_command("farm_agent", "--csr", str(key_path)), capture_output=True,
        timeout=120, check=False,
    )
    csr_pem = done.stdout.strip()
    if done.returncode != 0 or not csr_pem.startswith(b"-----BEGIN CERTIFICATE REQUEST-----"):
        last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise AgentError(f"cannot make this node's key and certificate request: {last[0]}")
    return key_path.read_bytes(), csr_pem + b"\n"


class HeadClient:
    def __init__(self, head: str, ca_pem: bytes | None = None, key_path: Path | None = None) -> None:
        """`ca_pem`: the head's pinned CA (None: a head without TLS). `key_path`: where a TLS client keeps the node's
        private key, NODE_KEY_FILE in the agent's state folder."""
        if ca_pem is not None and key_path is None:
            raise ValueError("a TLS client needs key_path: where the node's private key is kept")
        self.head = head
        self.ca_pem = ca_pem
        self.key_path = key_path
        self.channel = self._channel(head)
        self.stub = agent_pb2_grpc.AgentServiceStub(self.channel)
        # Heartbeat and Deregister: on the head's mutual-TLS port once a TLS head has signed this node's certificate.
        self.node_channel: grpc.aio.Channel | None = None
        self.node_stub = self.stub

    def _channel(self, target: str, key_pem: bytes | None = None, cert_pem: bytes | None = None) -> grpc.aio.Channel:
        if self.ca_pem is None:
            return grpc.aio.insecure_channel(target)
        return grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(self.ca_pem, key_pem, cert_pem))

    async def close(self) -> None:
        await self.channel.close()
        if self.node_channel is not None:
            await self.node_channel.close()

    async def register(
        self, join_token: str, name: str, hardware: Hardware, offers: list[BackendOffer], address: str, node_id: str,
        node_token: str = "", mtls_port: int = 0, admin_token: str = "",
    ) -> agent_pb2.RegisterReply:
        """Join, or join again as `node_id`: a node that exists proves it is itself, over mutual TLS (`mtls_port`)
        with its certificate from the last Register (a TLS head), or with its last `node_token` (a head without).
        Without a `join_token` the call carries the node's own token and id instead: a node joining again needs no
        join token (its own may have expired or been revoked since)."""
        key_pem, csr_pem = b"", b""
        stub, proof = self.stub, None
        host = self.head.rpartition(":")[0]
        if self.ca_pem is not None and self.key_path is not None:
            identity = self.key_path.with_name(NODE_IDENTITY_FILE)
            if node_id and mtls_port and identity.exists():
                held = identity.read_bytes()
                cert_at = held.find(b"-----BEGIN CERTIFICATE-----")
                proof = self._channel(f"{host}:{mtls_port}", held[:cert_at], held[cert_at:])
                stub = agent_pb2_grpc.AgentServiceStub(proof)
            key_pem, csr_pem = await new_node_key(self.key_path)
        request = agent_pb2.RegisterRequest(
            join_token=join_token, name=name, hardware=convert.hardware_to_pb(hardware),
            backends=[convert.offer_to_pb(o) for o in offers], agent_version=__version__, address=address,
            node_id=node_id, csr_pem=csr_pem, node_token=node_token, admin_token=admin_token,
        )
        try:
            reply: agent_pb2.RegisterReply = await stub.Register(
                request, metadata=credentials(join_token) if join_token else credentials(node_token, node_id),
                timeout=30, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNAUTHENTICATED:
                what = "the join token" if join_token else f"node {node_id}'s own credentials"
                raise AuthError(f"the head at {self.head} refused {what}: {exc.details()}") from None
            raise AgentError(f"cannot register with the head at {self.head}: {exc.details()}") from None
        finally:
            if proof is not None:
                await proof.close()
        if reply.client_cert_pem and reply.mtls_port and self.key_path is not None:
            write_private(self.key_path.with_name(NODE_IDENTITY_FILE), key_pem + reply.client_cert_pem)
            self.key_path.unlink(missing_ok=True)
            if self.node_channel is not None:
                await self.node_channel.close()
            self.node_channel = self._channel(f"{host}:{reply.mtls_port}", key_pem, reply.client_cert_pem)
            self.node_stub = agent_pb2_grpc.AgentServiceStub(self.node_channel)
        return reply

    def heartbeats(
        self, beats: AsyncIterator[agent_pb2.HeartbeatRequest], node_id: str, node_token: str
    ) -> grpc.aio.StreamStreamCall[agent_pb2.HeartbeatRequest, agent_pb2.HeartbeatReply]:
        return self.node_stub.Heartbeat(beats, metadata=credentials(node_token, node_id))

    def work(
        self, reports: AsyncIterator[agent_pb2.WorkReport], node_id: str, node_token: str
    ) -> grpc.aio.StreamStreamCall[agent_pb2.WorkReport, agent_pb2.WorkOrder]:
        """The node's work stream: `reports` must start with the node's hello."""
        return self.node_stub.Work(reports, metadata=credentials(node_token, node_id))

    async def code(self, node_id: str, node_token: str, job_id: str, limit: int) -> bytes:
        """A job's code package (at most `limit` bytes), from the head."""
        data = bytearray()
        call = self.node_stub.Code(agent_pb2.CodeRequest(node_id=node_id, node_token=node_token, job_id=job_id),
                                   metadata=credentials(node_token, node_id), timeout=300)
        async for part in call:
            data += part.data
            if len(data) > limit:
                call.cancel()
                raise AgentError(f"the head sent a code package past {limit:,} bytes")
        return bytes(data)

    async def deregister(self, node_id: str, node_token: str) -> None:
        try:
            await self.node_stub.Deregister(agent_pb2.DeregisterRequest(node_id=node_id, node_token=node_token),
                                            metadata=credentials(node_token, node_id),
                                            timeout=5)
        except (TimeoutError, grpc.aio.AioRpcError):
            pass  # the head is gone or forgot us: it will mark the node offline on its own
