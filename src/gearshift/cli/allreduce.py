"""`gearshift allreduce`: which all-reduce `auto` picks per message size, and why.

With --spec, the cost model's prediction for that cluster (any size, nothing runs). Without it, the job
measures its links (comm.calibrate) and times every algorithm next to the model: on local workers
(--workers, --ranks-per-node emulate the nodes; --testbed puts each node in its own network namespace
behind a shaped link), or one process per rank under torchrun. Every table names the leaders' node
matrix of each size (the cost model's pick, or --node-matrix).
"""

from __future__ import annotations

import argparse
import os
import re

from rich.console import Console
from rich.table import Table

from gearshift.cluster.topology import check_matrix, parse_matrix
from gearshift.errors import ConfigError
from gearshift.paths import check_output_file

DEFAULT_SIZES = "4KiB,64KiB,1MiB,16MiB,64MiB"
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1 << 10, "m": 1e6, "mb": 1e6, "mib": 1 << 20,
          "g": 1e9, "gb": 1e9, "gib": 1 << 30}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `gearshift allreduce`."""
    p.add_argument("--spec", help="cluster spec TOML: predict for it (default: measure this job)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"message sizes (default {DEFAULT_SIZES})")
    p.add_argument("--workers", type=int, default=4, help="local worker processes when measuring (default 4)")
    p.add_argument("--ranks-per-node", type=int, default=2,
                   help="local workers per emulated node when measuring (default 2)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per size and algorithm (default 3)")
    p.add_argument("--testbed", action="store_true",
                   help="run the local workers as emulated hosts on shaped links (gearshift testbed; needs root)")
    p.add_argument("--bandwidth", default="200mbit", help="testbed: every host link's cap (default 200mbit)")
    p.add_argument("--node-matrix", default="auto",
                   help="leaders' matrix of the hierarchical forms: auto (the model picks per size) or RxC, "
                        "R x C = the nodes (default auto)")
    p.add_argument("--out", help="also write the table as JSON (costs, one row per size and algorithm, auto's picks)")


def parse_sizes(text: str) -> list[int]:
    """'4KiB,1MiB,4096' -> byte counts; a bad entry is a one-line error naming --sizes."""
    sizes = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", part)
        unit = m and _UNITS.get(m.group(2).lower())
        if not m or unit is None or float(m.group(1)) * unit < 1:
            raise ConfigError(f"--sizes: {part.strip()!r} is not a size (e.g. 4096, 64KiB, 16MiB, 1GiB)")
        sizes.append(int(float(m.group(1)) * unit))
    return sizes


def fmt_size(n: int) -> str:
    """Bytes as '4 KiB', '16 MiB' (exact binary units), else '1500 B'."""
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def _ms(s: float) -> str:
    """Seconds as milliseconds, four significant digits."""
    return f"{s * 1e3:,.0f}" if s >= 1 else f"{s * 1e3:.4g}"


def prediction_table(counts: list[int], costs, sizes: list[int], title: str,
                     matrix: tuple[int, int] | None = None) -> Table:
    """Predicted ms of every algorithm at each size, `auto` = the one the model picks, and the leaders'
    node matrix the hierarchical forms run in (`matrix` when pinned)."""
    from gearshift.sim.collectives import ALGORITHMS, busbw, choose, predict, why

    t = Table(title=title)
    for col in ("size", *ALGORITHMS, "auto", "busbw Gbit/s", "leaders", "why"):
        t.add_column(col, justify="left" if col == "why" else "right")
    for size in sizes:
        times = {a: predict(a, size, counts, costs, matrix) for a in ALGORITHMS}
        pick = choose(size, counts, costs, matrix=matrix)
        t.add_row(fmt_size(size), *(f"[bold]{_ms(times[a])}[/bold]" if a == pick else _ms(times[a])
                                    for a in ALGORITHMS),
                  pick, f"{busbw(size, times[pick], sum(counts)) * 8 / 1e9:.2f}", _leaders(size, counts, costs, matrix),
                  why(size, counts, costs, matrix=matrix))
    return t


def fmt_matrix(shape: tuple[int, int]) -> str:
    """The leaders' arrangement for a table: "R x C" (1 x N: a ring of the nodes)."""
    return f"{shape[0]} x {shape[1]}"


def _leaders(size: int, counts: list[int], costs, matrix: tuple[int, int] | None) -> str:
    """The leader design's node matrix at this size ("-" on one node, where it runs gloo on the node)."""
    from gearshift.sim.collectives import node_matrix

    return "-" if len(counts) == 1 else fmt_matrix(node_matrix("hierarchical", size, counts, costs, matrix))


def measured_table(counts: list[int], costs, rows: list[dict], title: str,
                   matrix: tuple[int, int] | None = None) -> Table:
    """Measured ms of every algorithm (the model's in brackets), auto's pick, the fastest and the leaders'
    node matrix."""
    from gearshift.sim.collectives import ALGORITHMS, choose, predict, why

    t = Table(title=title)
    for col in ("size", *ALGORITHMS, "auto", "fastest", "leaders", "why (predicted)"):
        t.add_column(col, justify="left" if col.startswith("why") else "right")
    for size in sorted({r["size_bytes"] for r in rows}):
        got = {r["algorithm"]: r["time_s"] for r in rows if r["size_bytes"] == size}
        fastest = min(got, key=got.get)
        t.add_row(fmt_size(size),
                  *(f"{_ms(got[a])} ({_ms(predict(a, size, counts, costs, matrix))})" for a in ALGORITHMS),
                  choose(size, counts, costs, matrix=matrix), fastest, _leaders(size, counts, costs, matrix),
                  why(size, counts, costs, matrix=matrix))
    return t


def _measure(sizes: list[int], reps: int, out_path: str | None = None, matrix: tuple[int, int] | None = None) -> None:
    """One rank of the job (env://, as under torchrun): calibrate, time every algorithm at every size;
    rank 0 prints the measured costs and the table."""
    import torch.distributed as dist

    from gearshift.cluster.topology import Topology
    from gearshift.comm import CommGroups
    from gearshift.comm.calibrate import describe, measure_link_costs
    from gearshift.comm.measure import time_algorithms

    if os.environ.get("MASTER_ADDR") == "127.0.0.1":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # keep every byte on loopback
    dist.init_process_group("gloo")  # the algorithms run on CPU tensors over torch.distributed p2p
    rank = dist.get_rank()
    topo = Topology.from_env(gather=_gather)
    groups = CommGroups.build(topo)
    costs = measure_link_costs(groups)
    counts = topo.ranks_per_node
    if matrix is not None:
        check_matrix(matrix, len(counts), "--node-matrix")  # every rank: same topology, same answer
    console = Console(stderr=True)
    if rank == 0:
        console.print(f"[dim]{len(counts)} nodes x {counts}: calibrated; timing {len(sizes)} sizes x "
                      f"4 algorithms[/dim]")

    def progress(size: int) -> None:
        if rank == 0:
            console.print(f"[dim]  {fmt_size(size)} done[/dim]")
    rows = time_algorithms(groups, sizes, costs, reps=reps, on_size=progress, matrix=matrix)
    if rank == 0:
        out = _console()
        out.print(f"measured: {describe(costs, topo)}")
        out.print(measured_table(counts, costs, rows, f"all-reduce ms measured (model), {len(counts)} nodes x "
                                                      f"{counts} ranks", matrix))
        if out_path:
            write_json(out_path, counts, costs, sizes, rows, matrix)
    dist.barrier()


def write_json(path: str, counts: list[int], costs, sizes: list[int], measured: list[dict] | None = None,
               matrix: tuple[int, int] | None = None) -> None:
    """The table as JSON, written atomically: costs, a row per size and algorithm (predicted_time_s, the
    hierarchical forms' node_matrix, and time_s / samples when measured) and auto's pick per size."""
    import dataclasses
    import json
    from pathlib import Path

    from gearshift.sim.collectives import ALGORITHMS, choose, node_matrix, predict, why

    got = {(r["size_bytes"], r["algorithm"]): r for r in measured or []}
    rows = [{"size_bytes": size, "algorithm": a, "predicted_time_s": predict(a, size, counts, costs, matrix),
             **({"node_matrix": list(node_matrix(a, size, counts, costs, matrix))}
                if a.startswith("hierarchical") else {}),
             **({"time_s": got[(size, a)]["time_s"], "samples_s": got[(size, a)]["samples"]}
                if (size, a) in got else {})}
            for size in sizes for a in ALGORITHMS]
    out = {"mode": "measured" if measured else "predicted", "ranks_per_node": counts,
           "costs": dataclasses.asdict(costs), "rows": rows, "node_matrix": "auto" if matrix is None else list(matrix),
           "auto": [{"size_bytes": size, "algorithm": choose(size, counts, costs, matrix=matrix),
                     "why": why(size, counts, costs, matrix=matrix)} for size in sizes]}
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(out, indent=1))
    tmp.replace(path)


def _gather(obj) -> list:
    import torch.distributed as dist

    box = [None] * dist.get_world_size()
    dist.all_gather_object(box, obj)
    return box


def _console() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=160)  # piped: no truncated columns


def run(args: argparse.Namespace) -> int:
    """Predict for --spec; be one rank under torchrun (or our launcher); or launch the local workers."""
    if args.overrides:
        raise ConfigError(f"allreduce: unknown arguments {' '.join(args.overrides)}")
    sizes = parse_sizes(args.sizes)
    matrix = parse_matrix(args.node_matrix, "--node-matrix")
    if args.out:
        check_output_file(args.out, "--out")
    if args.reps < 1:
        raise ConfigError(f"--reps: must be >= 1, got {args.reps}")
    if args.spec:
        from gearshift.cluster.spec import load_spec
        from gearshift.cluster.topology import Topology
        from gearshift.sim.collectives import LinkCosts

        spec = load_spec(args.spec)
        counts = Topology.from_spec(spec).ranks_per_node
        if matrix is not None:
            check_matrix(matrix, len(counts), "--node-matrix")
        title = (f"predicted all-reduce ms, {len(counts)} nodes x {counts} ranks ({args.spec}); "
                 f"bold = auto's pick")
        costs = LinkCosts.from_network(spec.network)
        _console().print(prediction_table(counts, costs, sizes, title, matrix))
        if args.out:
            write_json(args.out, counts, costs, sizes, matrix=matrix)
        return 0
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # one rank of a job (torchrun or ours)
        from gearshift.train.worker import run_as_worker

        run_as_worker(lambda: _measure(sizes, args.reps, args.out, matrix))
        return 0
    w, per = args.workers, args.ranks_per_node
    if w < 1 or per < 1 or w % per:
        raise ConfigError(f"--workers, --ranks-per-node: need workers >= 1, a multiple of ranks-per-node >= 1; "
                          f"got {w} and {per}")
    if matrix is not None:  # one line here, before any worker starts
        check_matrix(matrix, w // per, "--node-matrix")
    return _launch(args, w, per)


def _launch(args: argparse.Namespace, workers: int, per_node: int) -> int:
    """Start `workers` ranks of this command (on the testbed's emulated hosts with --testbed)."""
    import sys
    import tempfile
    from pathlib import Path

    from gearshift.train.launch import run_ranks

    cmd = [sys.executable, "-m", "gearshift.cli.main", "allreduce", "--sizes", args.sizes, "--reps", str(args.reps),
           "--node-matrix", args.node_matrix]
    if args.out:
        cmd += ["--out", str(Path(args.out).resolve())]
    with tempfile.TemporaryDirectory(prefix="gs-allreduce-") as run_dir:
        if not args.testbed:
            return run_ranks(cmd, workers, per_node, Path(run_dir))
        from gearshift.cluster.testbed import Testbed, TestbedConfig

        with Testbed(TestbedConfig(workers // per_node, per_node, args.bandwidth)) as tb:
            return run_ranks(cmd, workers, per_node, Path(run_dir), tb if tb.emulated else None)
