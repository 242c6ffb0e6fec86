"""gearshift.comm: process groups from a Topology, all-reduce algorithms and bucketed gradient sync."""

from gearshift.comm.allreduce import ALGORITHMS, all_reduce
from gearshift.comm.buckets import GradientSync
from gearshift.comm.groups import CommGroups

__all__ = ["ALGORITHMS", "CommGroups", "GradientSync", "all_reduce"]
