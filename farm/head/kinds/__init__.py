"""Job kinds: one handler per kind, chosen by the spec's `kind`, behind one interface (farm.head.kinds.base).

The head's job path knows no kind: `Jobs.submit` asks the kind's handler to `plan` the work (items, the first shards,
the calibration key); each scheduling round the dispatcher asks it to `schedule` the job. A kind whose shards run
apart (a `ShardedKind`: inference, kernel-eval, evaluate) lets the dispatcher place them, and answers `task` (a
shard's Ray call, at launch), `record` (a result arrived: write its output, return its figures) and `sizes_shards`
(whether its shards are cut as the job runs, sized to the devices that free up: farm.head.autoshard). A kind whose
workers act together drives them itself (training). Every kind shares one path for results, failures and retries
(farm.head.outcomes), one atomic write and one manifest shape (farm.head.output); `finish` adds the kind's joined
outputs and manifest fields.

Adding a kind (evaluate.py is the smallest whole example):
1. farm/core/spec.py: a JobKind member, a spec model with `kind: Literal[JobKind.X]`, and its line in `JobSpec`.
2. farm/head/kinds/x.py: a subclass of ShardedKind (or KindHandler) implementing plan, task and record, and where
   the kind has them, metrics (its own figures of the job) and finish (its joined outputs, its manifest fields).
3. One line in HANDLERS below.
If its shards run code the agent does not have yet: that code in an agent module, its entry point in
farm_agent/entry.py, made remote in farm/head/remote.py (the head's only door into the agent).
"""

from __future__ import annotations

from farm.core.spec import JobKind
from farm.head.kinds.base import KindHandler
from farm.head.kinds.evaluate import Evaluate
from farm.head.kinds.inference import Inference
from farm.head.kinds.kernel_eval import KernelEval
from farm.head.kinds.training import Training
from farm.head.settings import HeadSettings
from farm.head.store import Store

HANDLERS: dict[JobKind, type[KindHandler]] = {
    JobKind.INFERENCE: Inference,
    JobKind.TRAINING: Training,
    JobKind.KERNEL_EVAL: KernelEval,
    JobKind.EVALUATE: Evaluate,
}


def handlers(settings: HeadSettings, store: Store | None = None) -> dict[JobKind, KindHandler]:
    """A handler of every kind, for one head (a handler may hold what it drives, as training does)."""
    return {kind: handler(settings, store) for kind, handler in HANDLERS.items()}
