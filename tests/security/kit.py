"""The malicious-lender kit: what a lender running its own modified agent can send a real head, built from Farm's own
parts (the agent's credentials and key making, the wire types, the head's in-process control plane on real gRPC and
TLS), with a hook at each place an honest agent would tell the truth: which node it claims to be, with which token
and certificate, and what bytes it sends.

Where each attack of issues 27 and 30 lives (one test per finding):
- a worker error whose unpickling runs code, secrets in Ray's environment, a lender's Ray credentials:
  test_execution_path.py (a real head and a real lent agent);
- uploads past a shard's range, too large a batch: test_upload_bounds.py;
- another node's identity (Register, Heartbeat: tests/integration/test_auth.py; the work stream and job code:
  test_malicious_lender.py, with this kit);
- links and hard links swapped into a dataset or output folder mid-job: test_data_service_links.py,
  test_output_folder.py;
- oversized and malformed messages: test_malicious_lender.py;
- the client side against a hostile head: fake_head.py, test_hostile_head_results.py.
- a tuning winner a lender reports, which the farm shares with every node of its GPU kind: test_shared_winners.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import grpc

from farm.proto.v1 import agent_pb2, agent_pb2_grpc
from farm_agent.daemon.client import credentials
from tests.integration.inprocess_head import Head


@dataclass(frozen=True)
class Joined:
    """A node as the head made it: its id and token, and the key and client certificate of its mutual TLS."""

    node_id: str
    token: str
    key_pem: bytes
    cert_pem: bytes
    mtls_port: int


class Lender:
    """A lender holding a join token (and what the head gave the nodes it joined), free to lie in every field."""

    def __init__(self, head: Head) -> None:
        self.head = head

    def join(self, name: str) -> Joined:
        reply, key_pem = self.head.register(self.head.tokens.join, name)
        return Joined(reply.node_id, reply.node_token, key_pem, reply.client_cert_pem, reply.mtls_port)

    def channel(self, over: Joined) -> grpc.Channel:
        """A channel to the head's mutual-TLS port with `over`'s key and certificate."""
        return self.head.channel(over.key_pem, over.cert_pem, over.mtls_port)

    def work(self, over: Joined, claim: str = "", token: str = "", hello: bool = True,
             reports: Iterable[agent_pb2.WorkReport] = ()) -> list[agent_pb2.WorkOrder]:
        """A work stream over `over`'s certificate whose hello (none: `hello` False) says it is node `claim`
        (default: itself) with `token` (default: its own), then `reports`; the orders the head sent before the
        stream ended. Raises grpc.RpcError."""
        node_id, token = claim or over.node_id, token or over.token
        said = [agent_pb2.WorkReport(hello=agent_pb2.WorkHello(node_id=node_id, node_token=token))] if hello else []
        with self.channel(over) as channel:
            orders = agent_pb2_grpc.AgentServiceStub(channel).Work(
                iter([*said, *reports]), metadata=credentials(token, node_id), timeout=5)
            return list(orders)

    def code(self, over: Joined, job_id: str, claim: str = "", token: str = "") -> bytes:
        """Job `job_id`'s code, asked for over `over`'s certificate as node `claim` with `token`. Raises
        grpc.RpcError."""
        node_id, token = claim or over.node_id, token or over.token
        with self.channel(over) as channel:
            parts = agent_pb2_grpc.AgentServiceStub(channel).Code(
                agent_pb2.CodeRequest(node_id=node_id, node_token=token, job_id=job_id),
                metadata=credentials(token, node_id), timeout=5)
            return b"".join(p.data for p in parts)

    def raw(self, method: str, body: bytes, metadata: tuple[tuple[str, str], ...], over: Joined | None = None
            ) -> None:
        """Bytes of the lender's choosing (malformed, oversized) as the request of AgentService's `method`, unary
        (Register) or a stream of one (Heartbeat, Work), over the join port or `over`'s mutual TLS. Raises
        grpc.RpcError: what the head answered."""
        with (self.channel(over) if over else self.head.channel()) as channel:
            path = f"/farm.v1.AgentService/{method}"
            if method == "Register":
                channel.unary_unary(path)(body, metadata=metadata, timeout=5)
            else:
                list(channel.stream_stream(path)(iter([body]), metadata=metadata, timeout=5))
