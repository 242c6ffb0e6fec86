"""`gearshift testbed up|down|status`: build, remove or show the emulated multi-host network."""

from __future__ import annotations

import argparse
import json

from gearshift.cluster.testbed import Testbed, TestbedConfig, cleanup, is_root, status


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["up", "down", "status"], help="build, remove or show the testbed")
    p.add_argument("--nodes", type=int, default=2, help="emulated hosts (network namespaces)")
    p.add_argument("--ranks-per-node", type=int, default=1, help="worker processes per host")
    p.add_argument("--bandwidth", default="1gbit", help="cap of every host link, e.g. 200mbit, 1gbit")
    p.add_argument("--per-node-bandwidth", default=None,
                   help="comma-separated caps, one per node (overrides --bandwidth)")
    p.add_argument("--prefix", default="gs-", help="name prefix of namespaces and links")


def run(args: argparse.Namespace) -> int:
    if args.action == "down":
        gone = cleanup(args.prefix)
        print(f"testbed down: removed {len(gone)} namespaces/links" if is_root() else
              "gearshift testbed: needs root; nothing to remove")
        return 0
    if args.action == "status":
        print(json.dumps(status(args.prefix), indent=2))
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
