"""The proposer loop against a local OpenAI-compatible test server that answers with fixed candidates (a test of the
loop, not of a model): round 1 a broken candidate, round 2 a correct one. The evaluator is the real one (CPU)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from farm.client.proposer import Endpoint, extract_code, propose
from farm_agent.work.local_eval import local_evaluator, local_winner_cache
from farm.core.errors import UserError
from farm.local import free_port
from farm_agent.tuner.cache import WinnerCache, make_key
from farm_agent.tuner.problem import load_problem

PROBLEM = Path(__file__).resolve().parents[1] / "fixtures" / "kernels" / "eval" / "problems" / "relu.py"
BROKEN = """Here is a first try:

```python
import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x, bogus=True)
```
"""
CORRECT = """Fixed, ReLU as a clamp:

```python
import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x.clamp(min=0)
```
"""


@dataclass
class ChatServer:
    url: str
    replies: list[str]
    requests: list[dict[str, Any]] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)


@pytest.fixture()
def server() -> Iterator[ChatServer]:
    """/v1/chat/completions answering the fixed replies in turn, recording what it was sent."""
    port = free_port()
    state = ChatServer(url=f"http://127.0.0.1:{port}/v1", replies=[BROKEN, CORRECT])

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        state.requests.append(body)
        state.keys.append(request.headers.get("Authorization", ""))
        reply = state.replies[min(len(state.requests), len(state.replies)) - 1]
        return web.json_response({"id": "x", "object": "chat.completion", "model": body["model"],
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": reply}}]})

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield state
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_feedback_reaches_the_next_round_and_the_correct_proposal_wins_into_the_cache(
        server: ChatServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROPOSER_KEY", "sk-test")
    endpoint = Endpoint(url=server.url, model="fixed", api_key_env="TEST_PROPOSER_KEY")
    proposal = propose(PROBLEM, endpoint, local_evaluator("cpu", runs=3, timeout_s=60, compile_baseline=False), rounds=2, hardware="cpu",
                       remember=local_winner_cache("cpu", folder=tmp_path / "cache"))

    first, second = proposal.rounds
    assert first.result is not None and not first.result.correct
    assert "TypeError" in first.result.error  # relu() got an unexpected keyword argument
    assert second.result is not None and second.result.correct and second.result.reward > 0
    assert (first.result.candidate, second.result.candidate) == ("round-1", "round-2")
    # Round 2's prompt is round 1's conversation plus the evaluator's verdict on it, error line included.
    assert server.keys == ["Bearer sk-test", "Bearer sk-test"] and server.requests[0]["model"] == "fixed"
    asked = server.requests[1]["messages"]
    assert [m["role"] for m in asked] == ["system", "user", "assistant", "user"]
    assert "class Model(" in asked[1]["content"] and "Hardware: cpu" in asked[1]["content"]
    assert asked[2]["content"] == BROKEN
    assert "correct: no" in asked[3]["content"] and first.result.error in asked[3]["content"]

    assert proposal.winner is second
    problem = load_problem(PROBLEM)
    cached = WinnerCache(tmp_path / "cache").get(make_key(problem.model("cpu"), problem.inputs("cpu", 0), 1e-4, 1e-4,
                                                          "cpu"))
    assert cached is not None and cached.source == extract_code(CORRECT) and cached.candidate == "proposed:round-2"
    assert proposal.cache_path and json.loads(Path(proposal.cache_path).read_text())["problem"] == "relu"


def test_a_reply_without_code_is_fed_back_and_an_unreachable_endpoint_is_a_user_error(server: ChatServer) -> None:
    server.replies = ["I cannot help with that."]
    proposal = propose(PROBLEM, Endpoint(url=server.url, model="m"), local_evaluator("cpu", compile_baseline=False),
                       rounds=1, hardware="cpu")
    assert proposal.rounds[0].code is None and "no ```python code block" in proposal.rounds[0].feedback
    assert proposal.winner is None
    with pytest.raises(UserError, match="HTTP 404"):
        propose(PROBLEM, Endpoint(url=server.url + "/nowhere", model="m"), local_evaluator("cpu"), rounds=1,
                hardware="cpu")


def test_farm_kernels_propose_runs_the_loop_from_the_command_line(server: ChatServer, tmp_path: Path) -> None:
    from tests.conftest import farm

    result = farm("kernels", "propose", str(PROBLEM), "--endpoint", server.url, "--model", "fixed", "--rounds", "2",
                  "--device", "cpu", "--runs", "3", "--no-compile", "--json", env={"FARM_STATE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [r["result"]["correct"] for r in report["rounds"]] == [False, True] and report["winner"] == 2
    assert report["cache_path"].startswith(str(tmp_path / "tuner" / "cache"))
    bad = farm("kernels", "propose", str(PROBLEM), "--endpoint", "ftp://x", "--model", "m")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--endpoint" in bad.stderr
