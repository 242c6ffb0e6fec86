"""`gearshift testbed up|down|status`: build, remove or show the emulated multi-host network."""

from __future__ import annotations

import argparse
import json

from rich import box
from rich.console import Console
from rich.table import Table

from gearshift.cli.argtypes import positive_int
from gearshift.cluster.testbed import Testbed, TestbedConfig, cleanup, is_root, status


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["up", "down", "status"], help="build, remove or show the testbed")
    p.add_argument("--nodes", type=positive_int, default=2, help="emulated hosts (network namespaces; default 2)")
    p.add_argument("--ranks-per-node", type=positive_int, default=1, help="worker processes per host (default 1)")
    p.add_argument("--bandwidth", default="1gbit", help="cap of every host link, e.g. 200mbit (default 1gbit)")
    p.add_argument("--per-node-bandwidth", default=None,
                   help="comma-separated caps, one per node (overrides --bandwidth)")
    p.add_argument("--prefix", default="gs-", help="name prefix of namespaces and links (default gs-)")
    p.add_argument("--json", action="store_true", help="status: print the raw JSON instead of a table")


def _bytes(n: int) -> str:
    """A byte count in decimal units, as network counters are read ('4.2 MB')."""
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n} B"


def print_status(st: dict) -> None:
    """Two rows per emulated host, out (host to network) and in: what crossed its shaper since `up`
    (throttled: times htb held a packet back at the cap; dropped: the queue was full)."""
    if not st["namespaces"]:
        print("no testbed is up" if is_root() else "gearshift testbed: needs root to see the namespaces")
        return
    table = Table(title="testbed hosts: traffic since `testbed up`", box=box.SIMPLE_HEAD)
    for col in ("host", "address", "cap", "way", "bytes", "packets", "throttled", "dropped"):
        table.add_column(col, justify="left" if col in ("host", "address", "way") else "right", no_wrap=True)
    for ns, info in sorted(st["namespaces"].items()):
        for way, key in (("out", "sent"), ("in", "received")):
            c = info[key] or {}
            head = (ns, (info["address"] or "-").split("/")[0], info["rate"] or "-") if way == "out" else ("", "", "")
            table.add_row(*head, way, *("-" if not c else _bytes(c[k]) if k == "bytes" else str(c[k])
                                        for k in ("bytes", "packets", "throttled", "dropped")))
    Console().print(table)


def run(args: argparse.Namespace) -> int:
    if args.action == "down":
        gone = cleanup(args.prefix)
        print(f"testbed down: removed {len(gone)} namespaces/links" if is_root() else
              "gearshift testbed: needs root; nothing to remove")
        return 0
    if args.action == "status":
        st = status(args.prefix)
        if args.json:
            print(json.dumps(st, indent=2))
        else:
            print_status(st)
        return 0
    per = args.per_node_bandwidth.split(",") if args.per_node_bandwidth else None
    cfg = TestbedConfig(args.nodes, args.ranks_per_node, args.bandwidth, per, args.prefix)
    tb = Testbed(cfg).up()
    if tb.emulated:
        for k in range(cfg.nodes):
            print(f"{tb.namespace(k)}  {tb.address(k)}  dev {tb.ifname}  {cfg.rate_bits(k) / 1e6:g} Mbit/s  "
                  f"ranks {k * cfg.ranks_per_node}..{(k + 1) * cfg.ranks_per_node - 1}")
        print(f"run a worker: ip netns exec {tb.namespace(0)} env GLOO_SOCKET_IFNAME={tb.ifname} "
              f"MASTER_ADDR={tb.address(0)} ...")
    return 0
