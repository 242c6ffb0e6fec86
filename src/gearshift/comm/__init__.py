"""gearshift.comm: process groups from a Topology, all-reduce algorithms and bucketed gradient sync.

The names load on first use: the modules import each other (`from gearshift.comm import sender`), which
must not run the whole package through this file."""

from gearshift.imports import lazy_dir, lazy_exports

__all__ = ["ALGORITHMS", "CommGroups", "GradientSync", "all_reduce"]
__getattr__ = lazy_exports(__name__, {
    "ALGORITHMS": "gearshift.comm.allreduce", "all_reduce": "gearshift.comm.allreduce",
    "GradientSync": "gearshift.comm.buckets", "CommGroups": "gearshift.comm.groups",
})
__dir__ = lazy_dir(__name__)
