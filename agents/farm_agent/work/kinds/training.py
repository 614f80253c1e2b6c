"""A training worker: a Ray actor on one device holding a replica of the job's model and its optimizer.

The head's training kind (farm.head.kinds.training) starts one per chosen device, joins them in a collective group and
calls `train` for each stretch of steps between checkpoints. Every worker walks the same sequence of global batches
(one permutation of the dataset per epoch, from the job's seed) and takes its own slice of each:

- sync: each worker's loss is its slice's mean loss × slice/global batch, so the gradients summed over the
  workers (one all-reduce per step) are exactly the single-worker gradient of the global batch, whatever the
  split. Every replica then takes the same optimizer step and the replicas stay identical.
- local-sgd: each worker steps on its own slice; every `sync_every` steps the parameters are averaged, weighted
  by the samples each worker saw since the last average (optimizer states stay local, as in DiLoCo's inner loop).

Collectives go through Ray's collective API: gloo (torch.distributed over TCP) for CPU tensors, NCCL when every
worker is on CUDA. Torch is imported inside the actor only: the head imports this module without it.

The head calls a worker through `call`, which sends the result back by the call's upload ticket
(farm_agent.work.upload): figures as protobuf, a stretch's losses as an Arrow table, the checkpoint as a safetensors
file. Never a Ray return value, which the head would have to unpickle; and a checkpoint holds tensors and plain
numbers, never a pickle.
"""

from __future__ import annotations

import json
import statistics
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from farm.core.errors import AgentError, SpecError
from farm.core.spec import Optimizer, SyncMode, TrainingSpec, parse_spec
from farm.core.tasks import ResultRoute, ShardFigures
from farm_agent.work.capture import take_output, worker_call
from farm_agent.work.environment import prepare_from_environment
from farm_agent.work.jobcode import build_model, load_dataset, resolve
from farm_agent.power import meter_for
from farm_agent.work.upload import Upload, send

if TYPE_CHECKING:
    import torch

# Forward-and-backward passes the speed probe times after one untimed pass (the first is slow); it takes their
# median, which one descheduled pass does not move. The first stretch's measured speeds correct it anyway.
PROBE_STEPS = 5


class TrainWorker:
    """Each method the head calls runs with the job code's output captured (farm_agent.work.capture.worker_call): what
    the worker printed since the last stretch, its model's construction and speed probe included, goes to the head with
    the next stretch's result, and a failure carries it with its traceback."""

    @worker_call
    def __init__(self, spec_yaml: str, job_id: str, rank: int, world: int, group: str, device: str, threads: int,
                 checkpoint: bytes | None, nccl: bool = False) -> None:
        """`nccl`: every worker of the group is on CUDA (else gloo, on host copies of the tensors)."""
        import torch

        prepare_from_environment()  # the job's requirements, before its code imports them

        spec = parse_spec(spec_yaml, job_id)
        assert isinstance(spec, TrainingSpec)  # the head only starts workers for training jobs
        self.spec = spec
        self.training = self.spec.training
        self.rank, self.world, self.group, self.nccl = rank, world, group, nccl
        self.device = torch.device(device)
        torch.set_num_threads(max(threads, 1))
        root = Path.cwd()
        self.inputs, labels = load_dataset(self.spec.dataset, root)
        if labels is None:
            raise SpecError(f"training dataset {self.spec.dataset!r} gives no labels: return (inputs, labels)")
        self.labels = labels
        torch.manual_seed(self.training.seed)  # identical initial replicas (rank 0's are broadcast anyway)
        self.model = build_model(self.spec.model, self.spec.weights, root).to(self.device).train()
        self.optimizer = _optimizer(self.spec, self.model.parameters())
        self.loss = loss_function(self.training.loss, root)
        self.step = 0
        self.since_sync = 0  # local-sgd: samples seen since the last parameter average
        if checkpoint is not None:  # made on another node: safetensors, tensors and numbers only, never code
            self.step = load_checkpoint(checkpoint, self.model, self.optimizer, self.device)
        self.meter = meter_for(device)
        self._permutations: dict[int, np.ndarray] = {}

    def call(self, route: ResultRoute, method: str, *args: Any) -> None:
        """One of the head's calls (join, probe, train, state, evaluate), its result sent by `route`."""

        def work(upload: Upload) -> ShardFigures:
            if method not in ("join", "probe", "train", "state", "evaluate"):
                raise AgentError(f"a training worker has no call {method!r}")
            began = time.perf_counter()
            result = getattr(self, method)(*args)
            if method == "train":
                upload.write(pa.table({"loss": pa.array(result["losses"], pa.float64())}))
                return ShardFigures(items=result["items"], seconds=result["seconds"], energy=result["energy"],
                                    log=result["log"], metrics={"compute_s": result["compute_s"]})
            if method == "state":
                upload.write_file(result)
            metrics = {"step": float(result)} if method == "join" else {"speed": result} if method == "probe" else \
                result if method == "evaluate" else {}
            return ShardFigures(items=0, seconds=time.perf_counter() - began, metrics=metrics)

        send(route, work)

    @worker_call
    def join(self) -> int:
        """Join the job's collective group and take rank 0's parameters (every worker calls this together)."""
        if self.world > 1:
            import ray.util.collective as col

            # ray annotates `backend` as its Backend class, which is made from (and compares as) the name
            col.init_collective_group(self.world, self.rank, backend="nccl" if self.nccl else "gloo",  # type: ignore[arg-type]
                                      group_name=self.group)
            for tensor in self.model.state_dict().values():
                self._broadcast(tensor)
        return self.step

    @worker_call
    def probe(self, items: int) -> float:
        """This worker's training speed (items per second of forward and backward) on `items`-sized batches."""
        x, y = self._slice(0, items, 0)
        timings = []
        for _ in range(PROBE_STEPS + 1):
            began = time.perf_counter()
            self.loss(self.model(x), y).backward()
            self._sync_device()
            timings.append(time.perf_counter() - began)
        self.model.zero_grad(set_to_none=True)
        return items / statistics.median(timings[1:])

    @worker_call
    def train(self, first: int, last: int, shares: list[int]) -> dict[str, Any]:
        """Steps [first, last) with `shares` (items of each global batch, per rank); losses of the global batch, and
        what the worker printed since the last stretch (`log`)."""
        if first != self.step:
            raise RuntimeError(f"worker at step {self.step} asked to train from step {first}")
        global_batch = sum(shares)
        offset, share = sum(shares[: self.rank]), shares[self.rank]
        losses: list[float] = []
        compute_s = 0.0
        with self.meter.window() as window:
            began = time.perf_counter()
            for step in range(first, last):
                x, y = self._slice(step, share, offset, global_batch)
                started = time.perf_counter()
                self.optimizer.zero_grad(set_to_none=True)
                if self.training.sync is SyncMode.SYNC:
                    # This slice's part of the global batch's mean loss; the sum over ranks is that mean.
                    loss = self.loss(self.model(x), y) * (share / global_batch)
                    loss.backward()
                    self._sync_device()
                    compute_s += time.perf_counter() - started
                    total = self._sum_gradients_and(loss.detach())
                else:
                    loss = self.loss(self.model(x), y)
                    loss.backward()
                    self._sync_device()
                    compute_s += time.perf_counter() - started
                    total = loss.detach()
                self.optimizer.step()
                self.step += 1
                self.since_sync += share
                if self.training.sync is SyncMode.LOCAL_SGD and (
                        self.step % self.training.sync_every == 0 or step == last - 1):
                    total = self._average_parameters_and(total)
                losses.append(float(total))
            self._sync_device()
            seconds = time.perf_counter() - began
        return {"rank": self.rank, "losses": losses, "items": share * (last - first), "seconds": seconds,
                "compute_s": compute_s, "energy": window.energy, "log": take_output(self)}

    @worker_call
    def state(self) -> bytes:
        """The model, optimizer and step, as a checkpoint (rank 0's: in sync mode every replica's is the same)."""
        return checkpoint_bytes(self.model, self.optimizer, self.step)

    @worker_call
    def evaluate(self, dataset: str) -> dict[str, float]:
        """Mean loss (and accuracy, for class scores) of the current model over `dataset`."""
        import torch

        inputs, labels = load_dataset(dataset, Path.cwd())
        if labels is None:
            return {}
        self.model.eval()
        losses, hits = [], 0
        with torch.inference_mode():
            for start in range(0, len(inputs), 512):
                x = torch.from_numpy(inputs[start : start + 512]).to(self.device)
                y = torch.from_numpy(labels[start : start + 512]).to(self.device)
                out = self.model(x)
                losses.append(float(self.loss(out, y)) * len(x))
                if out.ndim == 2 and y.ndim == 1:
                    hits += int((out.argmax(dim=1) == y).sum())
        self.model.train()
        result = {"eval_loss": sum(losses) / len(inputs)}
        if hits or labels.ndim == 1:
            result["accuracy"] = hits / len(inputs)
        return result

    # ---- internals

    def _slice(self, step: int, share: int, offset: int, global_batch: int | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's items of step `step`'s global batch: the job's per-epoch permutation, cut into batches."""
        import torch

        global_batch = global_batch or share
        per_epoch = max(len(self.inputs) // global_batch, 1)
        epoch, index = divmod(step, per_epoch)
        order = self._permutations.get(epoch)
        if order is None:
            order = self._permutations[epoch] = np.random.default_rng([self.training.seed, epoch]).permutation(
                len(self.inputs))
            self._permutations.pop(epoch - 2, None)
        chosen = order[index * global_batch + offset : index * global_batch + offset + share]
        return (torch.from_numpy(self.inputs[chosen]).to(self.device),
                torch.from_numpy(self.labels[chosen]).to(self.device))

    def _sum_gradients_and(self, loss: torch.Tensor) -> torch.Tensor:
        """All-reduce every gradient (one flat buffer, one call) and this rank's loss term with them."""
        import torch

        if self.world == 1:
            return loss
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads] + [loss.reshape(1)])
        flat = self._allreduce(flat)
        position = 0
        for g in grads:
            g.copy_(flat[position : position + g.numel()].view_as(g))
            position += g.numel()
        return flat[-1]

    def _average_parameters_and(self, loss: torch.Tensor) -> torch.Tensor:
        """Local-SGD's average: parameters (and the reported loss) weighted by the samples each rank saw."""
        import torch

        weight = float(self.since_sync)
        self.since_sync = 0
        if self.world == 1:
            return loss
        params = [p.data for p in self.model.parameters()]
        flat = torch.cat([p.reshape(-1) * weight for p in params] + [loss.reshape(1) * weight,
                                                                     torch.tensor([weight], device=loss.device)])
        flat = self._allreduce(flat)
        total = flat[-1]
        position = 0
        for p in params:
            p.copy_((flat[position : position + p.numel()] / total).view_as(p))
            position += p.numel()
        return flat[-2] / total

    def _allreduce(self, tensor: torch.Tensor) -> torch.Tensor:
        import ray.util.collective as col

        if self.device.type == "cuda" and not self.nccl:  # gloo reduces host tensors
            host = tensor.cpu()
            col.allreduce(host, group_name=self.group)
            return host.to(self.device)
        col.allreduce(tensor, group_name=self.group)
        return tensor

    def _broadcast(self, tensor: torch.Tensor) -> None:
        import ray.util.collective as col

        if self.device.type == "cuda" and not self.nccl:
            host = tensor.cpu()
            col.broadcast(host, src_rank=0, group_name=self.group)
            tensor.copy_(host)
        else:
            col.broadcast(tensor, src_rank=0, group_name=self.group)

    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)


MODEL_PREFIX = "model."
OPTIMIZER_PREFIX = "optimizer."


def checkpoint_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> bytes:
    """A checkpoint as safetensors: the model's tensors ("model.NAME"), the optimizer's per-parameter tensors
    ("optimizer.INDEX.KEY"), and in its metadata the step, the optimizer's parameter groups and its per-parameter
    numbers (JSON). Nothing in it is a pickle: whoever loads it runs no code from it."""
    from safetensors.torch import save

    def own(tensor: torch.Tensor) -> torch.Tensor:  # safetensors refuses tensors that share memory (tied weights)
        return tensor.detach().cpu().clone().contiguous()

    tensors = {MODEL_PREFIX + name: own(value) for name, value in model.state_dict().items()}
    state = optimizer.state_dict()
    numbers: dict[str, Any] = {}
    for index, values in state["state"].items():
        for key, value in values.items():
            if hasattr(value, "detach"):
                tensors[f"{OPTIMIZER_PREFIX}{index}.{key}"] = own(value)
            else:
                numbers[f"{index}.{key}"] = value
    return save(tensors, metadata={"step": str(step), "param_groups": json.dumps(state["param_groups"]),
                                   "numbers": json.dumps(numbers)})


def checkpoint_metadata(data: bytes) -> dict[str, str]:
    """A safetensors file's metadata, read from its JSON header (safetensors.torch.load gives the tensors only)."""
    (size,) = struct.unpack("<Q", data[:8])
    return dict(json.loads(data[8:8 + size]).get("__metadata__") or {})


def load_checkpoint(data: bytes, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    device: torch.device) -> int:
    """Load a checkpoint_bytes() checkpoint into `model` and `optimizer`; its step."""
    from safetensors.torch import load

    tensors = load(data)
    metadata = checkpoint_metadata(data)
    model.load_state_dict({name.removeprefix(MODEL_PREFIX): value.to(device) for name, value in tensors.items()
                           if name.startswith(MODEL_PREFIX)})
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith(OPTIMIZER_PREFIX):
            index, key = name.removeprefix(OPTIMIZER_PREFIX).split(".", 1)
            state.setdefault(int(index), {})[key] = value  # load_state_dict puts each where its parameter is
    for name, value in json.loads(metadata.get("numbers", "{}")).items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": json.loads(metadata["param_groups"])})
    return int(metadata["step"])


def _optimizer(spec: TrainingSpec, params: Any) -> torch.optim.Optimizer:
    import torch

    t = spec.training
    assert t is not None
    if t.optimizer is Optimizer.SGD:
        return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    if t.optimizer is Optimizer.ADAMW:
        return torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
    return torch.optim.Adam(params, lr=t.lr, weight_decay=t.weight_decay)


def loss_function(name: str, root: Path) -> Any:
    """A mean loss over a batch: outputs, targets -> scalar tensor."""
    from torch.nn import functional

    if name == "cross_entropy":
        return functional.cross_entropy
    if name == "mse":
        return lambda out, target: functional.mse_loss(out, target.to(out.dtype).reshape(out.shape))
    return resolve(name, root, "loss")
