"""Proposers: an external code model proposes candidate kernels for a problem, round after round, through an
OpenAI-compatible chat endpoint (POST {url}/chat/completions) that the user names. Off unless asked for
(`farm kernels propose`, or `propose(...)` from Python).

Each round the model sees one conversation: the problem's source and the hardware first, then, for every earlier
round, its own reply and the evaluator's feedback on it (compiled?, correct?, the error line, the speedups). The code
block of each reply is a candidate (a file defining ModelNew) and goes through the same hardened evaluator as every
other candidate: here (farm_agent.work.local_eval.local_evaluator, with the CLI) or on the fleet as a kernel-eval job
(`fleet_evaluator`). The fastest correct proposal wins; a local run keeps it in the optimizer's winner cache for this
device.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from farm.core.errors import UserError
from farm.core.kernels import KernelResult

if TYPE_CHECKING:
    from farm.client.api import Client

# Evaluates one round's candidate sources on a problem: one row per source, in order.
Evaluator = Callable[[Path, Sequence[str]], list[KernelResult]]

SYSTEM_PROMPT = (
    "You write fast PyTorch implementations. Given a problem file that defines `class Model(torch.nn.Module)`, "
    "`get_inputs()` and `get_init_inputs()`, answer with one complete Python file in a ```python code block that "
    "defines `class ModelNew(torch.nn.Module)`: same constructor arguments, same outputs (shapes, dtypes, values "
    "within the tolerance), faster. It may use custom CUDA or Triton kernels, or torch operations. It is checked on "
    "fresh random inputs and timed against eager PyTorch and torch.compile."
)
CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Endpoint:
    url: str  # the API's base, e.g. https://api.example.com/v1 (…/chat/completions is appended)
    model: str
    api_key_env: str = "OPENAI_API_KEY"  # the environment variable holding the key (none set: no key is sent)
    timeout_s: float = 300.0
    temperature: float | None = None


@dataclass(frozen=True)
class Round:
    number: int
    reply: str  # the model's answer, whole
    code: str | None  # its code block (None: it had none)
    result: KernelResult | None  # the evaluator's verdict (None: nothing to evaluate)
    feedback: str  # what the next round's prompt says about this one


@dataclass
class Proposal:
    problem: str
    hardware: str
    rounds: list[Round] = field(default_factory=list)
    winner: Round | None = None
    cache_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "problem": self.problem, "hardware": self.hardware, "cache_path": self.cache_path,
            "winner": self.winner.number if self.winner else None,
            "rounds": [{"round": r.number, "code": r.code, "feedback": r.feedback,
                        "result": r.result.to_dict() if r.result else None} for r in self.rounds],
        }


def first_prompt(problem_source: str, hardware: str) -> str:
    return (f"Hardware: {hardware}.\n\nThe problem:\n```python\n{problem_source.rstrip()}\n```\n\n"
            "Write ModelNew, faster than the reference on this hardware.")


def feedback(number: int, code: str | None, result: KernelResult | None) -> str:
    """The evaluator's verdict on one round, as the next prompt gives it."""
    if code is None:
        return f"Round {number}: your answer had no ```python code block: nothing was evaluated."
    if result is None:
        return f"Round {number}: not evaluated."
    lines = [f"Round {number}: compiled: {'yes' if result.compiled else 'no'}; "
             f"correct: {'yes' if result.correct else 'no'}."]
    if result.error:
        lines.append(f"Error: {result.error}")
    if result.correct:
        times = [f"median {result.median_ms:.4f} ms" if result.median_ms is not None else "not timed"]
        if result.speedup_vs_eager is not None:
            times.append(f"{result.speedup_vs_eager:.2f}x eager ({result.eager_ms:.4f} ms)")
        if result.speedup_vs_compile is not None:
            times.append(f"{result.speedup_vs_compile:.2f}x torch.compile ({result.compile_ms:.4f} ms)")
        lines.append("Timing: " + ", ".join(times) + ".")
    lines.append("Improve on it: answer with the whole file again." if result.correct
                 else "Fix it: answer with the whole file again.")
    return "\n".join(lines)


def extract_code(reply: str) -> str | None:
    """The last code block of a reply (models often show a snippet before the final file)."""
    blocks = CODE_BLOCK.findall(reply)
    return blocks[-1].strip() + "\n" if blocks else None


def chat(endpoint: Endpoint, messages: list[dict[str, str]]) -> str:
    """One chat completion; its first choice's text."""
    return asyncio.run(_chat(endpoint, messages))


async def _chat(endpoint: Endpoint, messages: list[dict[str, str]]) -> str:
    key = os.environ.get(endpoint.api_key_env, "")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body: dict[str, Any] = {"model": endpoint.model, "messages": messages}
    if endpoint.temperature is not None:
        body["temperature"] = endpoint.temperature
    url = endpoint.url.rstrip("/") + "/chat/completions"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=endpoint.timeout_s)) as session:
            async with session.post(url, json=body, headers=headers) as response:
                if response.status != 200:
                    text = (await response.text()).strip().splitlines()
                    raise UserError(f"{url}: HTTP {response.status}: {text[0][:200] if text else response.reason}")
                data = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise UserError(f"{url}: {type(exc).__name__}: {exc}") from None
    try:
        return str(data["choices"][0]["message"]["content"] or "")
    except (KeyError, IndexError, TypeError):
        raise UserError(f"{url}: not a chat completion (no choices[0].message.content)") from None


def propose(problem: Path, endpoint: Endpoint, evaluate: Evaluator, *, rounds: int = 3, hardware: str,
            remember: Callable[[Path, KernelResult, str], str | None] | None = None) -> Proposal:
    """Ask for a candidate `rounds` times, each round told how the earlier ones did; evaluate each; return every
    round and the winner (the fastest correct one). `remember(problem, row, source)` keeps the winner (the winner
    cache: see farm_agent.work.local_eval.local_winner_cache) and returns where."""
    if rounds < 1:
        raise UserError("rounds must be at least 1")
    source = problem.read_text()
    messages = [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": first_prompt(source, hardware)}]
    proposal = Proposal(problem=problem.stem, hardware=hardware)
    for number in range(1, rounds + 1):
        reply = chat(endpoint, messages)
        code = extract_code(reply)
        result = replace(evaluate(problem, [code])[0], candidate=f"round-{number}") if code is not None else None
        said = feedback(number, code, result)
        proposal.rounds.append(Round(number, reply, code, result, said))
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": said}]
    correct = [r for r in proposal.rounds if r.result is not None and r.result.correct]
    if correct:
        proposal.winner = min(correct, key=lambda r: (r.result.median_ms or float("inf"), r.number))  # type: ignore[union-attr]
        if remember is not None and proposal.winner.code is not None and proposal.winner.result is not None:
            proposal.cache_path = remember(problem, proposal.winner.result, proposal.winner.code)
    return proposal


def fleet_evaluator(client: Client, *, backends: Sequence[str] = ("cuda",), **options: Any) -> Evaluator:
    """Evaluate on the fleet: each round's proposals as one kernel-eval job."""

    def evaluate(problem: Path, sources: Sequence[str]) -> list[KernelResult]:
        return client.evaluate_kernels([problem], {problem.stem: list(sources)}, backends=backends, **options)

    return evaluate
