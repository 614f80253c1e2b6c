"""Two runtime fixes to the evaluator's worker, used by benchmarks/kernels/tune_h200.py's H200 run only
(PYTHONPATH=benchmarks/kernels/evaluator_fixes with FARM_EVALUATOR_FIXES=1) and recorded in its output. Both are
false rejections of honest candidates, in code that is not the optimizer's to change (farm_agent.tuner.worker);
this file changes nothing else. The worker has fixed both itself since (commit 3640941): this file only reproduces
the H200 run of docs/kernels-h200.md from the tree it ran (206577d); do not use it with later trees.

1. torch.compile rejected as "patched torch.nn.Module.__init__, __setstate__": the first compile in a process
makes dynamo wrap those two (torch._dynamo.mutation_guard.install_generation_tagging_init, idempotent). The worker
snapshots nn.Module's methods before each candidate, so whichever compiles first is rejected. Here the wrap is
installed at start-up, before any snapshot.

2. The worker (farm_agent.tuner.worker.Session.timed_call, not this file's to change) measures "device work still
pending after the candidate's stream finished" from the end of the stream to a device-wide synchronize, but copies
the outputs in between, so the copy's own device time counts as the candidate's pending work. On the H200 that
rejected eager itself wherever the output is large against the run time (a 1 GB output: 0.5 ms of copy against
the 0.1 ms + 5% allowance). Here the clock starts once those copies are done, so only work the candidate left
running is counted; everything else is the worker's own code.
"""

import os

if os.environ.get("FARM_EVALUATOR_FIXES") == "1":
    import torch._dynamo.mutation_guard

    import farm_agent.tuner.worker as w

    torch._dynamo.mutation_guard.install_generation_tagging_init()

    _original = w.Session.timed_call

    def timed_call(self, fn, inputs):  # type: ignore[no-untyped-def]
        if not self.cuda:
            return _original(self, fn, inputs)
        threads = w.threads_now()
        if w._current_stream(self.device) != self.stream:
            raise w.Rejected("changed the current CUDA stream")
        start, end = w._Event(enable_timing=True), w._Event(enable_timing=True)
        start.record(self.stream)
        outs = w.tensors_of(fn(*inputs), "forward")
        end.record(self.stream)
        end.synchronize()  # this stream is done ...
        early = [o.clone() for o in outs]
        copied = w._Event()
        copied.record(self.stream)
        copied.synchronize()  # ... and so are the worker's own copies of the outputs
        stream_done = w._perf_counter()
        w._synchronize(self.device)  # every other stream: how long that took is work left pending
        pending_ms = (w._perf_counter() - stream_done) * 1e3
        elapsed_ms = start.elapsed_time(end)
        if w._current_stream(self.device) != self.stream:
            raise w.Rejected("changed the current CUDA stream")
        if started := w.new_threads(threads):
            raise w.Rejected(f"left thread {started[0]!r} running after its forward returned (work must finish on "
                             "the caller's thread)")
        return outs, early, elapsed_ms, pending_ms

    w.Session.timed_call = timed_call
