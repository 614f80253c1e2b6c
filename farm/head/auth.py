"""Tokens: the join token agents present, the API token users present, the per-node token heartbeats carry."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

import grpc

from farm.core.errors import AuthError
from farm.local import read_json, write_json, write_private


class Tokens:
    def __init__(self, join: str, api: str) -> None:
        self.join = join
        self.api = api

    @classmethod
    def load_or_create(cls, state_dir: Path, ray_token_path: Path) -> Tokens:
        """Tokens survive head restarts, so agents and scripts keep working across them."""
        path = state_dir / "secrets.json"
        saved = read_json(path)
        if saved is None:
            saved = {"join_token": secrets.token_urlsafe(24), "api_token": secrets.token_urlsafe(24)}
            write_json(path, saved)
        if not ray_token_path.exists():
            write_private(ray_token_path, secrets.token_hex(32).encode())
        return cls(join=saved["join_token"], api=saved["api_token"])

    def check_join(self, token: str) -> None:
        if not hmac.compare_digest(token.encode(), self.join.encode()):
            raise AuthError("invalid join token")

    def check_api(self, context: grpc.aio.ServicerContext) -> None:
        metadata = dict(context.invocation_metadata() or ())
        presented = str(metadata.get("authorization", "")).removeprefix("Bearer ")
        if not hmac.compare_digest(presented.encode(), self.api.encode()):
            raise AuthError("invalid or missing API token")


def new_node_token() -> tuple[str, str]:
    """A node token and the hash the store keeps of it."""
    token = secrets.token_urlsafe(24)
    return token, hash_token(token)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_node_token(token: str, stored_hash: str | None) -> None:
    if stored_hash is None or not hmac.compare_digest(hash_token(token), stored_hash):
        raise AuthError("unknown node or invalid node token")
