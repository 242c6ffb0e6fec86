"""gearshift.planner: pure planning (no torch) from a ModelProfile and a ClusterState."""

from gearshift.planner.partition import CostModel, PartitionResult, blocks, cost_model, partition_dp
from gearshift.planner.plan import plan_partition
from gearshift.planner.replan import FirstPlan, ReplanDecision, decide_replan, first_plan

__all__ = ["CostModel", "FirstPlan", "PartitionResult", "ReplanDecision", "blocks", "cost_model", "decide_replan",
           "first_plan", "partition_dp", "plan_partition"]
