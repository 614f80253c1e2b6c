"""Pure placement: filters drop what cannot run a shard (each with a reason), scorers rank what can, assignment
fills free slots. No gRPC, no Ray, no I/O."""

from farm.scheduler.placement import place
from farm.scheduler.types import Assignment, Placement, Rate, ShardRequest, Waiting

__all__ = ["Assignment", "Placement", "Rate", "ShardRequest", "Waiting", "place"]
