"""Tokens: the join tokens agents present, the API token users present, the per-node token heartbeats carry; and
the refusals: logged without the secret, and limited per peer address.

Join tokens are records in the store (a hash, an expiry, a revoked flag, its uses and their limit): `farm head token
create|list|revoke`. The one made at the head's first start (secrets.json) is the record `default`, valid until revoked,
with no use limit. Each lets in at most `HeadSettings.join_rate_per_min` new nodes a minute (JoinRateLimiter).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import math
import os
import secrets
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from farm.core.errors import AuthError, RateLimitError
from farm.head.store.tokens import used_up
from farm.local import read_json, write_json, write_private

if TYPE_CHECKING:
    from farm.head.settings import HeadSettings
    from farm.head.store import Store

log = logging.getLogger("farm.head.auth")

DEFAULT_JOIN_TOKEN_ID = "default"


class FailureLimiter:
    """After `allowed` failed authentications from one peer address within `window_s`, that address is refused for
    `window_s` without its credentials being checked: guessing tokens gets `allowed` tries a window, no more."""

    MAX_PEERS = 10_000  # addresses remembered at most (an attacker with many addresses must not fill the memory)

    def __init__(self, allowed: int, window_s: float, clock: Callable[[], float] = time.monotonic,
                 exempt: Callable[[str], bool] = lambda peer: False) -> None:
        self.allowed = allowed
        self.window_s = window_s
        self.clock = clock
        self.exempt = exempt
        self._failures: dict[str, deque[float]] = {}
        self._blocked_until: dict[str, float] = {}

    def blocked_for(self, peer: str) -> float:
        """Seconds this peer stays refused (0: not refused)."""
        until = self._blocked_until.get(peer)
        if until is None:
            return 0.0
        left = until - self.clock()
        if left <= 0:
            del self._blocked_until[peer]
            return 0.0
        return left

    def failed(self, peer: str) -> None:
        if self.exempt(peer):
            return
        now = self.clock()
        if len(self._failures) >= self.MAX_PEERS and peer not in self._failures:
            self._failures.clear()
        failures = self._failures.setdefault(peer, deque())
        failures.append(now)
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        if len(failures) >= self.allowed:
            self._blocked_until[peer] = now + self.window_s
            del self._failures[peer]


class JoinRateLimiter:
    """At most `per_minute` new nodes per join token in any 60 s: a leaked or shared token cannot add a fleet of fake
    nodes in a second (one did 300 in 1.4 s). It keeps the times of each token's last `per_minute` joins, no more,
    for at most MAX_TOKENS tokens; 0: no limit."""

    WINDOW_S = 60.0
    MAX_TOKENS = 1_000  # tokens are the admin's records, so few; bounded all the same

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self._joins: dict[str, deque[float]] = {}

    def wait_s(self, token_id: str) -> float:
        """Seconds until the token may let in another node (0: now)."""
        joins = self._joins.get(token_id)
        if not self.per_minute or joins is None or len(joins) < self.per_minute:
            return 0.0
        return max(0.0, joins[0] + self.WINDOW_S - self.clock())  # the oldest of the last per_minute joins

    def joined(self, token_id: str) -> None:
        if not self.per_minute:
            return
        now = self.clock()
        if token_id not in self._joins and len(self._joins) >= self.MAX_TOKENS:
            # forget the tokens with no join in the window; all of them if that frees nothing
            quiet = [t for t, joins in self._joins.items() if joins[-1] <= now - self.WINDOW_S]
            for t in quiet or list(self._joins):
                del self._joins[t]
        self._joins.setdefault(token_id, deque(maxlen=self.per_minute)).append(now)


def peer_address(context: grpc.aio.ServicerContext) -> str:
    """The peer's address without its port ("ipv4:10.0.0.5:51234" → "10.0.0.5")."""
    peer = str(context.peer() or "unknown")
    kind, _, rest = peer.partition(":")
    return rest.rpartition(":")[0] if kind in ("ipv4", "ipv6") else peer


def is_loopback(peer: str) -> bool:
    try:
        return ipaddress.ip_address(peer.strip("[]")).is_loopback
    except ValueError:
        return False


def fingerprint(secret: str) -> str:
    """What a log may say of a presented secret: a short prefix of its hash, enough to tell two apart."""
    return hash_token(secret)[:8] if secret else "none"


class Tokens:
    def __init__(self, join: str, api: str, *, open_read: bool = False, node_certs: bool = False,
                 limiter: FailureLimiter | None = None, served: bool = False,
                 join_rate: JoinRateLimiter | None = None) -> None:
        self.join = join
        self.api = api
        self.open_read = open_read  # listing calls need no API token
        self.node_certs = node_certs  # Heartbeat and Deregister need the node's own client certificate
        self.limiter = limiter or FailureLimiter(allowed=20, window_s=60.0)
        self.served = served  # under a head's policy (for_server) already
        self.join_rate = join_rate or JoinRateLimiter(per_minute=30)

    @classmethod
    def load_or_create(cls, state_dir: Path, ray_token_path: Path) -> Tokens:
        """Tokens survive head restarts, so agents and scripts keep working across them."""
        path = state_dir / "secrets.json"
        saved = read_json(path)
        if saved is None:
            saved = {"join_token": secrets.token_urlsafe(24), "api_token": secrets.token_urlsafe(24)}
            write_json(path, saved)
        pending = pending_ray_token(ray_token_path)
        if pending.exists():  # `farm head token rotate-ray` (or a revocation) made it: it takes effect now
            os.replace(pending, ray_token_path)
        if not ray_token_path.exists():
            write_private(ray_token_path, secrets.token_hex(32).encode())
        return cls(join=saved["join_token"], api=saved["api_token"])

    def for_server(self, settings: HeadSettings) -> Tokens:
        """The same secrets under the head's policy (open reads, client certificates, the failure limit): one
        limiter for the gRPC services and the dashboard, so a peer's failures count together."""
        if self.served:
            return self
        exempt = (lambda peer: False) if settings.limit_loopback else is_loopback
        return Tokens(self.join, self.api, open_read=settings.open_read, node_certs=not settings.insecure,
                      limiter=FailureLimiter(settings.auth_failures_allowed, settings.auth_block_s, exempt=exempt),
                      served=True, join_rate=JoinRateLimiter(settings.join_rate_per_min))

    # ---- checks: each raises AuthError (UNAUTHENTICATED) and counts the failure against the peer

    def _gate(self, context: grpc.aio.ServicerContext) -> str:
        return self._gate_peer(peer_address(context))

    def _gate_peer(self, peer: str) -> str:
        left = self.limiter.blocked_for(peer)
        if left:
            raise AuthError(f"too many failed authentications from {peer}: refused for another {left:.0f} s")
        return peer

    def refuse(self, context: grpc.aio.ServicerContext, reason: str, secret: str) -> AuthError:
        """The error for a call refused before its servicer ran (farm.head.gate), counted and logged alike."""
        try:
            peer = self._gate(context)
        except AuthError as blocked:
            return blocked
        return self._refuse(peer, reason, secret)

    def _refuse(self, peer: str, reason: str, secret: str, what: str = "a call") -> AuthError:
        self.limiter.failed(peer)
        log.warning("refused %s from %s: %s (credential hash %s)", what, peer, reason, fingerprint(secret))
        return AuthError(reason)

    def check_join(self, token: str, store: Store, context: grpc.aio.ServicerContext) -> str:
        """The id of the valid join token `token` (the store's records; the default one among them)."""
        peer = self._gate(context)
        record = store.join_token(hash_token(token))
        if record is None:
            raise self._refuse(peer, "invalid join token", token)
        if record["revoked"]:
            raise self._refuse(peer, f"join token {record['id']} was revoked", token)
        if record["expires_at"] and record["expires_at"] < time.time():
            raise self._refuse(peer, f"join token {record['id']} has expired", token)
        return str(record["id"])

    def check_join_room(self, token_id: str, store: Store) -> None:
        """Whether join token `token_id` (valid: check_join) may let in one more new node: under its use limit and its
        rate. Not counted as failed authentication: the token is good, and many machines behind one address (a
        rollout behind NAT) must not lock that address out."""
        record = store.join_token_by_id(token_id)
        if record is not None and record["max_uses"] and record["uses"] >= record["max_uses"]:
            log.warning("refused a join: %s", used_up(token_id, record["uses"]))
            raise AuthError(used_up(token_id, record["uses"]))
        wait = self.join_rate.wait_s(token_id)
        if wait:
            log.warning("refused a join: join token %s is at its rate", token_id)
            raise RateLimitError(f"join token {token_id} let in {self.join_rate.per_minute} new nodes in the last "
                                 f"minute, its limit: try again in {math.ceil(wait)} s")

    def use_join(self, token_id: str, store: Store) -> None:
        """Count a new node let in by join token `token_id` (refused if another join took its last use meanwhile)."""
        store.use_join_token(token_id)
        self.join_rate.joined(token_id)

    def check_api(self, context: grpc.aio.ServicerContext) -> None:
        metadata = dict(context.invocation_metadata() or ())
        presented = str(metadata.get("authorization", "")).removeprefix("Bearer ")
        self.check_api_from(peer_address(context), presented)

    def check_api_from(self, peer: str, presented: str, what: str = "a call") -> None:
        """The API token, presented by `peer` (an address; the dashboard's requests come here). `what` names the
        request in the log: escape what a client chose in it."""
        self._gate_peer(peer)
        if not hmac.compare_digest(presented.encode(), self.api.encode()):
            raise self._refuse(peer, "invalid or missing API token", presented, what)

    def is_admin(self, presented: str) -> bool:
        """Whether `presented` is the API token (a trusted node's proof at Register)."""
        return bool(presented) and hmac.compare_digest(presented.encode(), self.api.encode())

    def check_secret(self, context: grpc.aio.ServicerContext, presented: str, expected: str | None,
                     reason: str) -> None:
        """A credential made for one purpose (a job's read credential): `presented` must be `expected`."""
        self.check_secret_at(peer_address(context), presented, expected, reason)

    def check_secret_at(self, peer: str, presented: str, expected: str | None, reason: str) -> None:
        """check_secret for a caller outside gRPC (the bulk port, farm.head.bulk), by its address."""
        peer = self._gate_peer(peer)
        if expected is None or not hmac.compare_digest(presented.encode(), expected.encode()):
            raise self._refuse(peer, reason, presented)

    def check_read(self, context: grpc.aio.ServicerContext) -> None:
        """Listing nodes and jobs: open to anyone who reaches the head when the head says so (--open-read)."""
        if not self.open_read:
            self.check_api(context)

    def check_node(self, context: grpc.aio.ServicerContext, node_id: str, token: str, stored_hash: str | None
                   ) -> None:
        """A joined node's call: its node token, and (with TLS) the client certificate the head issued to it."""
        peer = self._gate(context)
        if stored_hash is None or not hmac.compare_digest(hash_token(token), stored_hash):
            raise self._refuse(peer, "unknown node or invalid node token", token)
        if self.node_certs and certificate_names(context) != [node_id]:
            raise self._refuse(peer, f"node {node_id}'s calls need its client certificate "
                               "(mutual TLS on the head's mTLS port)", token)

    def check_returning_node(self, context: grpc.aio.ServicerContext, node_id: str, token: str,
                             stored_hash: str) -> None:
        """Register with the id of a node that exists: only that node may. Node ids are public (the dashboard shows
        them), so the join token alone never makes a caller an existing node. With TLS the proof is the call made
        over mutual TLS with the certificate the head issued to that node (not its node token, which each Register
        replaces: a machine killed before it saved the new one would be locked out); without TLS, its node token."""
        if not self.node_certs:
            self.check_node(context, node_id, token, stored_hash)
            return
        peer = self._gate(context)
        if certificate_names(context) != [node_id]:
            raise self._refuse(peer, f"node {node_id} exists: re-registering it needs its client certificate "
                               "(mutual TLS on the head's mTLS port)", token)


def certificate_names(context: grpc.aio.ServicerContext) -> list[str]:
    """The common names of the client certificate this call came with (a node's id), if any."""
    return [n.decode(errors="replace") for n in (context.auth_context() or {}).get("x509_common_name") or []]


def pending_ray_token(ray_token_path: Path) -> Path:
    """Where a new Ray token waits for the head's next start: Ray's GCS takes its token when it starts, so a running
    cluster keeps the one it has."""
    return ray_token_path.with_name(ray_token_path.name + ".next")


def rotate_ray_token(ray_token_path: Path) -> None:
    write_private(pending_ray_token(ray_token_path), secrets.token_hex(32).encode())


def new_join_token() -> tuple[str, str, str]:
    """A join token's id, the token, and the hash the store keeps of it."""
    token = secrets.token_urlsafe(24)
    return "jt-" + secrets.token_hex(4), token, hash_token(token)


def new_node_token() -> tuple[str, str]:
    """A node token and the hash the store keeps of it."""
    token = secrets.token_urlsafe(24)
    return token, hash_token(token)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_node_token(token: str, stored_hash: str | None) -> None:
    if stored_hash is None or not hmac.compare_digest(hash_token(token), stored_hash):
        raise AuthError("unknown node or invalid node token")
