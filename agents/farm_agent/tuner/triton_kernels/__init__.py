"""Farm's own Triton kernels, one file per family (linear_act, norm, softmax), and `rewrite`, which swaps the
submodules of a model that match their patterns for modules that call them.

Triton is imported only when a rewritten module runs on a GPU (or under TRITON_INTERPRET=1): CI has neither.
"""

from farm_agent.tuner.triton_kernels.rewrite import count_matches, rewrite

__all__ = ["count_matches", "rewrite"]
