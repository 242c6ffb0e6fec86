"""Cluster specs: device types, nodes and network, read from TOML so a user can plan for a cluster
they are not running on."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gearshift.errors import SpecError
from gearshift.tomlfile import read_toml

GB = 1e9
LOCAL_MEMORY = 8 * GB  # bytes per local worker that planning allows when no cluster spec says (memory checks)


@dataclass(frozen=True)
class Device:
    """One accelerator (or worker process): its type, relative speed, memory and place in a node."""

    kind: str
    speed: float  # relative compute speed; 1.0 = the device that ran the profile
    memory_bytes: float
    node: int = 0
    local_rank: int = 0
    nic_hops: int = 0  # hops to the node's network card; 0 = direct access


@dataclass(frozen=True)
class Network:
    """Bandwidths (bytes/s) and latencies (s) inside a node and between nodes."""

    intra_bandwidth: float = 100 * GB / 8
    inter_bandwidth: float = 10 * GB / 8
    intra_latency: float = 5e-6
    inter_latency: float = 20e-6
    nic_bandwidth: float = float("inf")  # a node's card, shared by all its concurrent inter-node flows


@dataclass
class ClusterSpec:
    """Devices in topology (rank) order plus the network that joins them. `cores[node]`: CPU cores the
    node's workers share (co-tenant hosts, more workers than cores); a node without one is not shared."""

    devices: list[Device]
    network: Network = field(default_factory=Network)
    cores: dict[int, float] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return len(self.devices)

    @property
    def num_nodes(self) -> int:
        return len({d.node for d in self.devices})

    def bandwidth(self, a: int, b: int) -> float:
        same = self.devices[a].node == self.devices[b].node
        return self.network.intra_bandwidth if same else self.network.inter_bandwidth

    def latency(self, a: int, b: int) -> float:
        same = self.devices[a].node == self.devices[b].node
        return self.network.intra_latency if same else self.network.inter_latency

    @classmethod
    def uniform(cls, n: int, speed: float = 1.0, memory_bytes: float = 16 * GB,
                ranks_per_node: int | None = None, network: Network | None = None,
                cores: float | None = None) -> ClusterSpec:
        """n identical devices, `ranks_per_node` to a node (all on one node by default), each node's
        workers sharing `cores` CPU cores (None: not shared)."""
        per = ranks_per_node or n
        devs = [Device("cpu", speed, memory_bytes, node=i // per, local_rank=i % per) for i in range(n)]
        nodes = (n + per - 1) // per
        return cls(devs, network or Network(), {} if cores is None else dict.fromkeys(range(nodes), cores))

    @classmethod
    def from_speeds(cls, speeds: list[float], memory_bytes: float = 16 * GB,
                    network: Network | None = None) -> ClusterSpec:
        """One node of devices with the given relative speeds."""
        return cls([Device(f"dev{i}", s, memory_bytes, local_rank=i) for i, s in enumerate(speeds)],
                   network or Network())


def _num(table: dict, key: str, where: str, default: float | None = None, positive: bool = True) -> float:
    if key not in table:
        if default is None:
            raise SpecError(f"{where}.{key}: missing (a number is required)")
        return default
    v = table[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:  # v != v: TOML's nan
        raise SpecError(f"{where}.{key}: expected a number, got {v!r}")
    if positive and v <= 0:
        raise SpecError(f"{where}.{key}: must be > 0, got {v!r}")
    return float(v)


def parse_spec(data: dict) -> ClusterSpec:
    """Build a ClusterSpec from a parsed TOML table.

    [types.A100]  speed = 1.0, memory_gb = 40
    [[nodes]]     devices = ["A100", "T4"], nic_hops = [0, 1]   (nic_hops optional),
                  cores = 2 (optional: CPU cores the node's workers share; default: not shared)
    [network]     intra_gbps, inter_gbps (Gbit/s, one flow), intra_latency_us, inter_latency_us,
                  nic_gbps (optional: a node's card, shared by all its flows; default no cap)
    """
    known = {"types", "nodes", "network"}
    for k in data:
        if k not in known:
            job = k in ("model", "data", "cluster", "parallel", "train", "output")  # a job config's sections
            hint = "; this is a job config, not a cluster spec (pass the job as CONFIG)" if job else ""
            raise SpecError(f"cluster spec: unknown section {k!r} (allowed: {', '.join(sorted(known))}){hint}")
    types = data.get("types", {})
    if not types:
        raise SpecError("cluster spec: [types] is missing (define at least one device type)")
    kinds: dict[str, tuple[float, float]] = {}
    for name, t in types.items():
        kinds[name] = (_num(t, "speed", f"types.{name}"), _num(t, "memory_gb", f"types.{name}") * GB)
    nodes = data.get("nodes", [])
    if not nodes:
        raise SpecError("cluster spec: [[nodes]] is missing (list at least one node)")
    devices: list[Device] = []
    cores: dict[int, float] = {}
    node_keys = ("devices", "nic_hops", "cores")
    for ni, node in enumerate(nodes):
        if not isinstance(node, dict):
            raise SpecError(f"nodes[{ni}]: expected a table (devices = [...]), got {node!r}")
        for k in node:
            if k not in node_keys:
                raise SpecError(f"nodes[{ni}].{k}: unknown key (allowed: {', '.join(node_keys)})")
        if "cores" in node:
            cores[ni] = _num(node, "cores", f"nodes[{ni}]")
        names = node.get("devices")
        if not isinstance(names, list) or not names:
            raise SpecError(f"nodes[{ni}].devices: expected a non-empty list of device type names")
        hops = node.get("nic_hops", [0] * len(names))
        if not isinstance(hops, list) or len(hops) != len(names):
            raise SpecError(f"nodes[{ni}].nic_hops: expected a list of {len(names)} integers")
        for li, (name, h) in enumerate(zip(names, hops)):
            if name not in kinds:
                raise SpecError(f"nodes[{ni}].devices: unknown type {name!r} (defined: {', '.join(kinds)})")
            if not isinstance(h, int) or h < 0:
                raise SpecError(f"nodes[{ni}].nic_hops: expected integers >= 0, got {h!r}")
            speed, mem = kinds[name]
            devices.append(Device(name, speed, mem, node=ni, local_rank=li, nic_hops=h))
    net = data.get("network", {})
    allowed = ("intra_gbps", "inter_gbps", "intra_latency_us", "inter_latency_us", "nic_gbps")
    for k in net:
        if k not in allowed:
            raise SpecError(f"network.{k}: unknown key (allowed: {', '.join(allowed)})")
    d = Network()
    network = Network(
        intra_bandwidth=_num(net, "intra_gbps", "network", d.intra_bandwidth * 8 / GB) * GB / 8,
        inter_bandwidth=_num(net, "inter_gbps", "network", d.inter_bandwidth * 8 / GB) * GB / 8,
        intra_latency=_num(net, "intra_latency_us", "network", d.intra_latency * 1e6) * 1e-6,
        inter_latency=_num(net, "inter_latency_us", "network", d.inter_latency * 1e6) * 1e-6,
        nic_bandwidth=_num(net, "nic_gbps", "network", float("inf")) * GB / 8,
    )
    return ClusterSpec(devices, network, cores)


def load_spec(path: str | Path) -> ClusterSpec:
    """Read a cluster spec TOML file; errors name the field."""
    return parse_spec(read_toml(path, "cluster.spec", SpecError))
