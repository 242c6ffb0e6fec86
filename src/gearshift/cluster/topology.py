"""Topology: which node and local rank each global rank has, its distance to the node's network card,
the leader of each node and the R x C matrix the leaders (or same-local-rank peers) form."""

from __future__ import annotations

import math
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gearshift.cluster.spec import ClusterSpec
from gearshift.errors import ConfigError, SpecError


def matrix_shape(n: int) -> tuple[int, int]:
    """R x C with R * C == n exactly and R the largest divisor of n not above sqrt(n).

    Exact factorisation keeps every row the same length, so the row reduce-scatter and the column
    all-reduce need no special cases; a prime n gives 1 x n (a plain ring), and e.g. 6 -> 2 x 3,
    12 -> 3 x 4, 16 -> 4 x 4. A ragged last row was rejected: it would break the column step.
    """
    if n < 1:
        raise ValueError(f"matrix_shape: n must be >= 1, got {n}")
    r = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return r, n // r


def matrix_shapes(n: int) -> list[tuple[int, int]]:
    """Every R x C with R * C == n, R ascending: the shapes a node matrix of n nodes may be pinned to."""
    return [(r, n // r) for r in range(1, n + 1) if n % r == 0]


def parse_matrix(text: str, where: str = "node_matrix") -> tuple[int, int] | None:
    """'auto' -> None (the cost model picks per message); 'RxC' (e.g. '2x3') -> (R, C); else a one-line
    ConfigError naming `where`."""
    if text.strip() == "auto":
        return None
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ConfigError(f"{where}: {text!r} (allowed: auto, or RxC with R, C >= 1, e.g. 2x4)")
    return int(m.group(1)), int(m.group(2))


def check_matrix(shape: tuple[int, int], nodes: int, where: str = "node_matrix") -> None:
    """A pinned R x C must hold exactly the `nodes` it arranges: the 2D steps need every row the same length
    (a ragged last row would leave some columns without a member there). A one-line ConfigError names the
    shapes allowed; a prime count allows only 1 x N and N x 1, both a ring of the nodes."""
    rows, cols = shape
    if rows * cols != nodes:
        allowed = ", ".join(f"{r}x{c}" for r, c in matrix_shapes(nodes))
        raise ConfigError(f"{where}: {rows}x{cols} holds {rows * cols} nodes but the all-reduce spans {nodes} "
                          f"(allowed: auto, {allowed})")


@dataclass
class Topology:
    """node[r], local_rank[r] and nic_hops[r] for each global rank r; nodes are numbered 0..N-1."""

    node: list[int]
    local_rank: list[int]
    nic_hops: list[int]

    def __post_init__(self) -> None:
        n = len(self.node)
        if len(self.local_rank) != n or len(self.nic_hops) != n:
            raise SpecError("topology: node, local_rank and nic_hops must have one entry per rank")
        if n and sorted(set(self.node)) != list(range(max(self.node) + 1)):
            raise SpecError(f"topology: nodes must be numbered 0..N-1 without gaps, got {sorted(set(self.node))}")
        for nd in range(self.num_nodes):
            locals_ = sorted(self.local_rank[r] for r in self.ranks_of(nd))
            if locals_ != list(range(len(locals_))):
                raise SpecError(f"topology: node {nd} has local ranks {locals_}, expected 0..{len(locals_) - 1}")

    # ---- construction ----
    @classmethod
    def from_ranks_per_node(cls, counts: list[int], nic_hops: list[list[int]] | None = None) -> Topology:
        """Explicit layout: counts[k] ranks on node k, consecutive global ranks (uneven allowed)."""
        if not counts or any(c < 1 for c in counts):
            raise SpecError(f"topology: ranks per node must be a non-empty list of counts >= 1, got {counts}")
        node = [k for k, c in enumerate(counts) for _ in range(c)]
        local = [i for c in counts for i in range(c)]
        hops = [h for k, c in enumerate(counts) for h in (nic_hops[k] if nic_hops else [0] * c)]
        return cls(node, local, hops)

    @classmethod
    def from_spec(cls, spec: ClusterSpec) -> Topology:
        """From a ClusterSpec's devices (rank order); node ids are renumbered 0..N-1 in order of appearance."""
        ids: dict[int, int] = {}
        for d in spec.devices:
            ids.setdefault(d.node, len(ids))
        return cls([ids[d.node] for d in spec.devices], [d.local_rank for d in spec.devices],
                   [d.nic_hops for d in spec.devices])

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, gather=None) -> Topology:
        """From torchrun's variables (WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK or NODE_RANK).

        With uniform LOCAL_WORLD_SIZE torchrun places ranks node-major, so the layout follows from the
        sizes alone. `gather(obj) -> list` (e.g. dist.all_gather_object) lets ranks exchange their
        (node, local_rank, hops) instead, which also covers uneven nodes.
        """
        env = dict(os.environ if env is None else env)
        world = int(env.get("WORLD_SIZE", "1"))
        local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
        local_rank = int(env.get("LOCAL_RANK", env.get("RANK", "0")))
        node_rank = int(env.get("GROUP_RANK", env.get("NODE_RANK", "0")))
        hops = nic_hops_for(local_rank)
        if gather is not None:  # without LOCAL_RANK (e.g. mp.spawn) each node's ranks count up in rank order
            rows = gather((node_rank, local_rank if "LOCAL_RANK" in env else None, hops))
            node = [r[0] for r in rows]
            local = [r[1] if r[1] is not None else node[:i].count(node[i]) for i, r in enumerate(rows)]
            return cls(node, local, [r[2] for r in rows])
        if world % local_world:
            raise SpecError(f"topology: WORLD_SIZE {world} is not a multiple of LOCAL_WORLD_SIZE {local_world}; "
                            "pass gather= to exchange layouts")
        return cls.from_ranks_per_node([local_world] * (world // local_world))

    def subset(self, ranks: list[int]) -> Topology:
        """The topology of a group of these ranks (e.g. one stage's replicas), indexed 0..len(ranks) - 1 in
        the given order: nodes renumbered by first appearance, local ranks re-counted by the old order."""
        if len(set(ranks)) != len(ranks) or any(not 0 <= r < self.world_size for r in ranks):
            raise SpecError(f"topology: subset ranks must be distinct ranks of 0..{self.world_size - 1}, got {ranks}")
        ids: dict[int, int] = {}
        for r in ranks:
            ids.setdefault(self.node[r], len(ids))
        node = [ids[self.node[r]] for r in ranks]
        local = [sum(1 for q in ranks if self.node[q] == self.node[r] and self.local_rank[q] < self.local_rank[r])
                 for r in ranks]
        return Topology(node, local, [self.nic_hops[r] for r in ranks])

    # ---- queries ----
    @property
    def world_size(self) -> int:
        return len(self.node)

    @property
    def num_nodes(self) -> int:
        return max(self.node) + 1 if self.node else 0

    def ranks_of(self, node: int) -> list[int]:
        """Global ranks on `node`, ordered by local rank."""
        return sorted((r for r in range(self.world_size) if self.node[r] == node), key=lambda r: self.local_rank[r])

    @property
    def ranks_per_node(self) -> list[int]:
        return [len(self.ranks_of(k)) for k in range(self.num_nodes)]

    @property
    def uniform(self) -> bool:
        """True when every node has the same number of ranks."""
        return len(set(self.ranks_per_node)) <= 1

    def leader(self, node: int) -> int:
        """The rank nearest the node's network card (fewest hops; ties by lowest rank)."""
        return min(self.ranks_of(node), key=lambda r: (self.nic_hops[r], r))

    @property
    def leaders(self) -> list[int]:
        return [self.leader(k) for k in range(self.num_nodes)]

    @property
    def matrix(self) -> tuple[int, int]:
        """R x C shape of the node matrix (see matrix_shape)."""
        return matrix_shape(self.num_nodes)

    def node_grid(self, shape: tuple[int, int] | None = None) -> list[list[int]]:
        """Nodes laid out row-major in the R x C matrix (`shape`, default the near-square one):
        grid[row][col] = node index."""
        rows, cols = shape or self.matrix
        if rows * cols != self.num_nodes:
            raise ValueError(f"node_grid: shape {rows} x {cols} does not hold {self.num_nodes} nodes")
        return [[i * cols + j for j in range(cols)] for i in range(rows)]

    def to_dict(self) -> dict:
        return {"node": self.node, "local_rank": self.local_rank, "nic_hops": self.nic_hops}


def nic_hops_for(local_rank: int) -> int:
    """Best-effort hops from GPU `local_rank` to the nearest NIC, from `nvidia-smi topo -m`; 0 if unknown."""
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return _sysfs_hops(local_rank)
    hops = parse_topo_matrix(out).get(local_rank)
    return _sysfs_hops(local_rank) if hops is None else hops


# nvidia-smi link kinds, nearest first: same board / PCIe switch / PCIe bridges / host bridge / NUMA / socket
_LINK_HOPS = {"X": 0, "PIX": 0, "PXB": 1, "PHB": 2, "NODE": 3, "SYS": 4}


def parse_topo_matrix(text: str) -> dict[int, int]:
    """GPU index -> hops to its nearest NIC column in `nvidia-smi topo -m` output (NV# links ignored)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return {}
    header = lines[0].split()
    nic_cols = [i for i, h in enumerate(header) if h.upper().startswith(("NIC", "MLX"))]
    result: dict[int, int] = {}
    for ln in lines[1:]:
        cells = ln.split()
        m = re.fullmatch(r"GPU(\d+)", cells[0]) if cells else None
        if not m or not nic_cols:
            continue
        vals = [_LINK_HOPS.get(cells[c + 1], 4) for c in nic_cols if c + 1 < len(cells)]
        if vals:
            result[int(m.group(1))] = min(vals)
    return result


def _sysfs_hops(local_rank: int) -> int:
    """Without nvidia-smi: 1 if sysfs shows this GPU and a NIC on different NUMA nodes, else 0 (unknown)."""
    try:
        gpus = sorted(p for p in Path("/sys/bus/pci/devices").iterdir()
                      if (p / "class").read_text().startswith("0x0302") or
                      (p / "class").read_text().startswith("0x0300"))
        nics = [p for p in Path("/sys/bus/pci/devices").iterdir() if (p / "class").read_text().startswith("0x0200")]
        if local_rank >= len(gpus) or not nics:
            return 0
        numa = lambda p: (p / "numa_node").read_text().strip()
        return 0 if any(numa(n) == numa(gpus[local_rank]) for n in nics) else 1
    except OSError:
        return 0
