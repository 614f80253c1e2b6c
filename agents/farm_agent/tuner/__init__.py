"""CUDA kernel tuning: problems in the common format (problem), the hardened evaluator that measures candidate
implementations in child processes (evaluator, worker), and the optimizer built on top of it."""
