"""gearshift.planner: pure planning (no torch.distributed) from a ModelProfile and a ClusterState."""

from gearshift.planner.partition import (
    CostModel,
    PartitionResult,
    blocks,
    cost_model,
    partition_dp,
    plan_partition,
)
from gearshift.planner.replan import ReplanDecision, decide_replan

__all__ = ["CostModel", "PartitionResult", "ReplanDecision", "blocks", "cost_model", "decide_replan",
           "partition_dp", "plan_partition"]
