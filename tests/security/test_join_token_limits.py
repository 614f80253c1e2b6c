"""One join token registered 300 nodes in 1.4 s (issue 30, item 10): a leaked or shared token could flood the fleet
with fake nodes. Each token now lets in at most `join_rate_per_min` new nodes a minute (30 by default) and at most
its `--max-uses`; a node joining again on its own credentials is no use of it and is never held back. Against an
in-process head (127.0.0.1, its own CA, no Ray)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from typer.testing import CliRunner, Result

from farm.cli import head as head_cli
from tests.integration.inprocess_head import running_head


def test_one_join_token_cannot_register_a_fleet_in_a_second(tmp_path: Path) -> None:
    with running_head(tmp_path) as head:  # the head's defaults: 30 new nodes a minute per token
        def farm(*args: str) -> Result:  # `farm head token ...` in this process
            return CliRunner().invoke(head_cli.app, ["token", *args, "--state-dir", str(tmp_path)])

        admitted, refused = [], []
        for i in range(40):  # the attack: one token, many machines, as fast as the head answers
            try:
                admitted.append(head.register(head.tokens.join, f"fake-{i}"))
            except grpc.RpcError as exc:
                refused.append(exc)
        assert len(admitted) == 30 and len(refused) == 10
        assert {exc.code() for exc in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}  # type: ignore[attr-defined]
        details = str(refused[0].details())  # type: ignore[attr-defined]
        assert details.startswith("join token default let in 30 new nodes in the last minute, its limit: try again "
                                  "in ") and details.endswith(" s"), details

        # A node that joined joins again on its own credentials: not held back by its token's rate, and no use of it.
        reply, key = admitted[0]
        again, _ = head.register("", "fake-0", node_id=reply.node_id, node_token=reply.node_token,
                                 identity=(key, reply.client_cert_pem))
        assert again.node_id == reply.node_id
        listed = {r["id"]: r for r in json.loads(farm("list", "--json").stdout)}
        assert (listed["default"]["uses"], listed["default"]["max_uses"]) == (30, 0)

        # A token made for two machines lets in two, and then no more, whatever the rate.
        created = farm("create", "--max-uses", "2", "--json")
        assert created.exit_code == 0, created.output
        token = json.loads(created.stdout.strip().splitlines()[-1])
        assert token["max_uses"] == 2
        head.register(token["token"], "lent-1")
        head.register(token["token"], "lent-2")
        with pytest.raises(grpc.RpcError) as used_up:
            head.register(token["token"], "lent-3")
        assert used_up.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert used_up.value.details() == f"join token {token['id']} has been used 2 times, its limit"
        listed = {r["id"]: r for r in json.loads(farm("list", "--json").stdout)}
        assert (listed[token["id"]]["uses"], listed[token["id"]]["max_uses"]) == (2, 2)
        shown = farm("list").stdout
        assert f"{token['id']:<12} used up  uses 2 of 2" in shown and "default      valid    uses 30 " in shown
