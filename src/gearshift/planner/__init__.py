"""gearshift.planner: pure planning (no torch) from a ModelProfile and a ClusterState."""

from gearshift.planner.partition import PartitionCosts, PartitionResult, blocks, partition_costs, partition_dp
from gearshift.planner.plan import plan_partition
from gearshift.planner.replan import FirstPlan, ReplanDecision, decide_replan, first_plan

__all__ = ["FirstPlan", "PartitionCosts", "PartitionResult", "ReplanDecision", "blocks", "decide_replan", "first_plan",
           "partition_costs", "partition_dp", "plan_partition"]
