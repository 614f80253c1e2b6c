"""The submit preflight, in a child process of `farm submit` (`python -m farm_agent.work.check JSON`), in the job's
environment: load the dataset as a node would and, unless told not to, build the model and run it on CPU over the
dataset's first rows, saying in one line what a node would have failed on (a dtype the model does not take, outputs
that are not one row per input). Prints one JSON object: {"items": N, "model_bytes": M} or {"error": "..."}. The
parent (farm.client.check) bounds its time and memory."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from farm.core.errors import FarmError
from farm_agent.work.environment import prepare_from_environment

ROWS = 2  # a small batch: enough to see the model's batch dimension, cheap on any model


def preflight(model: str, weights: str | None, dataset: str | None, root: Path, more_datasets: list[str] | None = None,
              run_model: bool = True, preprocess: str | None = None) -> dict[str, Any]:
    """`dataset` None: a dataset by location, which the head plans and counts; the model is built (not run: its
    inputs are the preprocess's, on rows only the nodes read) and the preprocess imported."""
    from farm_agent.work.jobcode import build_model, load_dataset, resolve

    if dataset is None:
        if preprocess:
            resolve(preprocess, root, "preprocess")
        if not run_model:
            return {"items": 0}
        module = build_model(model, weights, root)
        return {"items": 0, "model_bytes": sum(t.numel() * t.element_size()
                                               for t in (*module.parameters(), *module.buffers()))}
    inputs, _ = load_dataset(dataset, root)
    for extra in more_datasets or ():  # training's eval set
        load_dataset(extra, root)
    return {"items": len(inputs), **(check(model, weights, inputs, root) if run_model else {})}


def check(model: str, weights: str | None, inputs: np.ndarray, root: Path, rows: int = ROWS) -> dict[str, Any]:
    import torch

    from farm_agent.work.jobcode import build_model

    module = build_model(model, weights, root)
    model_bytes = sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
    batch = np.ascontiguousarray(inputs[:rows])
    expects = next((p.dtype for p in module.parameters() if p.is_floating_point()), None)
    hint = ""
    if expects is not None and batch.dtype.kind == "f" and torch.from_numpy(batch[:0]).dtype != expects:
        hint = (f" (the dataset is {batch.dtype} and the model's parameters are {str(expects).removeprefix('torch.')}"
                f": cast one to the other, e.g. inputs.astype(np.{str(expects).removeprefix('torch.')}))")
    try:
        with torch.inference_mode():
            outputs = module(torch.from_numpy(batch))
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        return {"error": f"the model fails on the dataset's first {len(batch)} rows on CPU: "
                         f"{type(exc).__name__}: {first}{hint}"}
    if not isinstance(outputs, torch.Tensor):
        return {"error": f"the model returns {type(outputs).__name__}, not a tensor: a node keeps one tensor of "
                         "outputs per batch"}
    if outputs.ndim == 0 or outputs.shape[0] != len(batch):
        return {"error": f"the model turns {len(batch)} rows into outputs of shape {tuple(outputs.shape)}: a node "
                         "needs one output row per input row (the batch dimension first)"}
    if outputs.dtype.is_complex:
        return {"error": f"the model's outputs are {outputs.dtype}, which a node cannot store"}
    return {"model_bytes": int(model_bytes), "dtype": str(outputs.dtype).removeprefix("torch."),
            "shape": list(outputs.shape[1:])}


def main() -> None:
    args = json.loads(sys.argv[1])
    try:
        with contextlib.redirect_stdout(sys.stderr):  # what the job's code prints is not our answer
            prepare_from_environment()
            result = preflight(args["model"], args.get("weights"), args["dataset"], Path(args["root"]),
                               args.get("more_datasets"), bool(args.get("check", True)), args.get("preprocess"))
    except FarmError as exc:
        result = {"error": exc.message}
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
