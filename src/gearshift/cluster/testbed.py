"""Emulated multi-host network: one Linux network namespace per node, veth pairs to a bridge in the root
namespace, each host link shaped with tc htb in both directions, so workers talk over real (shaped)
sockets. Needs root; without it the Testbed falls back to the local cluster on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gearshift.errors import ConfigError

STATE_DIR = Path("/run/gearshift")
QUEUE_S = 0.02  # seconds of a host link's rate its shaper queues before dropping
_UNITS = {"": 1, "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}


def parse_rate(text: str) -> float:
    """'200mbit' / '1gbit' / '500kbit' / '25mbps' (bytes) / '1000000' -> bits per second."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS or float(m.group(1)) <= 0:
        raise ConfigError(f"bandwidth: expected a rate like 200mbit or 1gbit, got {text!r}")
    return float(m.group(1)) * _UNITS[unit]


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def missing_tools() -> list[str]:
    """The iproute2 commands the testbed runs that are not on PATH (a minimal image may lack them)."""
    return [t for t in ("ip", "tc") if shutil.which(t) is None]


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run one ip/tc command; failures raise with the command and its stderr."""
    p = subprocess.run(list(args), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {p.stderr.strip()}")
    return p


@dataclass
class TestbedConfig:
    """N emulated hosts with L ranks each; every host link capped at `bandwidth` (or per node) each way, or
    into each host at its own `per_node_ingress` rate (links that differ by direction). A transfer from host
    a to host b runs at most at min(a's rate out, b's rate in)."""

    __test__ = False  # not a pytest class

    nodes: int
    ranks_per_node: int = 1
    bandwidth: str = "1gbit"
    per_node_bandwidth: list[str] | None = None
    prefix: str = "gs-"
    subnet: str = "10.213.7"  # the /24 used only inside these namespaces
    # largest packet the shaper sees (GSO): a smaller one bursts less past the cap, a larger one costs
    # less CPU per byte (docs/benchmarks.md: 1,500-byte packets against 16 KiB)
    max_packet: int = 16 << 10
    per_node_ingress: list[str] | None = None  # rate into each host (network -> host); None: as its rate out

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.nodes > 250:
            raise ConfigError(f"testbed.nodes: expected 1..250, got {self.nodes}")
        if self.ranks_per_node < 1:
            raise ConfigError(f"testbed.ranks_per_node: expected >= 1, got {self.ranks_per_node}")
        if self.per_node_bandwidth is not None and len(self.per_node_bandwidth) != self.nodes:
            raise ConfigError(f"testbed.per_node_bandwidth: expected {self.nodes} rates, "
                              f"got {len(self.per_node_bandwidth)}")
        if self.per_node_ingress is not None and len(self.per_node_ingress) != self.nodes:
            raise ConfigError(f"testbed.per_node_ingress: expected {self.nodes} rates, "
                              f"got {len(self.per_node_ingress)}")
        for r in [self.bandwidth, *(self.per_node_bandwidth or []), *(self.per_node_ingress or [])]:
            parse_rate(r)
        if not 1500 <= self.max_packet <= 65536:
            raise ConfigError(f"testbed.max_packet: expected 1500..65536 bytes, got {self.max_packet}")
        if not re.fullmatch(r"[a-z0-9]{1,4}-", self.prefix):
            raise ConfigError(f"testbed.prefix: expected 1-4 lowercase letters/digits and '-', got {self.prefix!r}")

    def rate_bits(self, node: int) -> float:
        """The cap on what `node` sends (host -> network), bits/s."""
        return parse_rate(self.per_node_bandwidth[node] if self.per_node_bandwidth else self.bandwidth)

    def ingress_bits(self, node: int) -> float:
        """The cap on what `node` receives (network -> host), bits/s."""
        return parse_rate(self.per_node_ingress[node]) if self.per_node_ingress else self.rate_bits(node)


@dataclass
class Testbed:
    """Namespaces {prefix}n{k}, in-namespace interface {prefix}eth at {subnet}.{k+1}, root-side veth
    {prefix}v{k} on bridge {prefix}br. `emulated` is False when we fell back to 127.0.0.1."""

    __test__ = False

    config: TestbedConfig
    emulated: bool = False
    log: list[str] = field(default_factory=list)

    # ---- names ----
    def namespace(self, node: int) -> str:
        return f"{self.config.prefix}n{node}"

    @property
    def ifname(self) -> str:
        return f"{self.config.prefix}eth" if self.emulated else "lo"

    @property
    def bridge(self) -> str:
        return f"{self.config.prefix}br"

    def host_veth(self, node: int) -> str:
        return f"{self.config.prefix}v{node}"

    def address(self, node: int) -> str:
        return f"{self.config.subnet}.{node + 1}" if self.emulated else "127.0.0.1"

    # ---- lifecycle ----
    def up(self) -> Testbed:
        """Clean leftovers with our prefix, then build namespaces, veths, bridge and shaping."""
        missing = missing_tools()
        if not is_root() or missing:
            why = "needs root (ip netns, tc)" if not is_root() else f"needs iproute2 ({', '.join(missing)} not found)"
            print(f"gearshift testbed: {why}; falling back to the local cluster on 127.0.0.1")
            self.emulated = False
            return self
        cleanup(self.config.prefix)
        self.emulated = True
        c = self.config
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        _sh("ip", "link", "set", self.bridge, "up")
        for k in range(c.nodes):
            ns, hv = self.namespace(k), self.host_veth(k)
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", hv, "type", "veth", "peer", "name", self.ifname, "netns", ns)
            _sh("ip", "link", "set", hv, "master", self.bridge)
            _sh("ip", "link", "set", hv, "up")
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.address(k)}/24", "dev", self.ifname)
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", self.ifname, "up")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            # collectives send in bursts: do not fall back to slow start between steps
            _sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_slow_start_after_idle=0")
            _shape(["ip", "netns", "exec", ns], self.ifname, c.rate_bits(k), c.max_packet)  # host -> network
            _shape([], hv, c.ingress_bits(k), c.max_packet)  # network -> host
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        (STATE_DIR / f"testbed-{c.prefix}json").write_text(json.dumps(asdict(c)))
        return self

    def down(self) -> None:
        """Remove every namespace, link and state file with our prefix."""
        if self.emulated:
            cleanup(self.config.prefix)
            self.emulated = False

    def set_rate(self, node: int, out: str | None = None, into: str | None = None) -> None:
        """Change `node`'s caps while workers run (htb classes changed in place, queues kept): `out` on what it
        sends, `into` on what it receives (rates like 200mbit); None leaves that direction as it is."""
        if not self.emulated:
            raise RuntimeError("testbed: set_rate needs the emulated testbed (up, as root)")
        if out is not None:
            _set_rate(["ip", "netns", "exec", self.namespace(node)], self.ifname, parse_rate(out))
        if into is not None:
            _set_rate([], self.host_veth(node), parse_rate(into))

    def __enter__(self) -> Testbed:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # ---- running workers ----
    def command(self, node: int, argv: list[str]) -> list[str]:
        """argv run inside node's namespace (`ip netns exec`); unchanged when not emulated."""
        return ["ip", "netns", "exec", self.namespace(node), *argv] if self.emulated else list(argv)

    def worker_env(self, node: int, port: int, rank: int | None = None, world: int | None = None) -> dict:
        """Environment for a gloo worker on `node`: bind to the node's interface, rendezvous at node 0.
        c10d warns once per rank that it cannot resolve the namespace address's host name (there is
        none); its C++ log level is ERROR unless the caller's environment sets one."""
        env = {"GLOO_SOCKET_IFNAME": self.ifname, "MASTER_ADDR": self.address(0), "MASTER_PORT": str(port),
               "GEARSHIFT_NODE": str(node), "GEARSHIFT_NODE_ADDR": self.address(node),
               "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}
        if rank is not None:
            env["RANK"] = str(rank)
        if world is not None:
            env["WORLD_SIZE"] = str(world)
        return env

    def popen(self, node: int, argv: list[str], env: dict | None = None, **kw) -> subprocess.Popen:
        """Start argv inside node's namespace with os.environ + env."""
        return subprocess.Popen(self.command(node, argv), env={**os.environ, **(env or {})}, **kw)


def _shape(prefix: list[str], dev: str, bits: float, max_packet: int) -> None:
    """htb on dev's egress capped at `bits`/s: payload-free TCP segments (ACKs) in a priority class, all
    data in a class over a byte fifo holding QUEUE_S of the rate. Without this, ACKs of the opposite
    direction wait behind seconds of queued GSO packets and a two-way exchange runs at half the cap. Data,
    however small, stays in its flow's order: a rule by length (< 128 B) let gloo's tiny messages overtake
    their connection's queued bulk, and receivers that saw them early made senders retransmit for nothing.
    GSO packets are capped at `max_packet` bytes: htb charges a packet after sending it, so a rested link
    passes one whole packet at once, however long it holds the wire."""
    tc = [*prefix, "tc"]
    _sh(*prefix, "ip", "link", "set", "dev", dev, "gso_max_size", str(max_packet))
    _sh(*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "20", "r2q", "100")
    for cls in _classes(bits):
        _sh(*tc, "class", "add", "dev", dev, *cls)
    _sh(*tc, "qdisc", "add", "dev", dev, "parent", "1:20", "handle", "20:", "bfifo", "limit", str(_queue(bits)))
    for words in range(5, 16):  # TCP header length in 32-bit words: a segment is payload-free when the IP
        # packet (20-byte header) is exactly 20 + 4 words bytes long
        _sh(*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
            "match", "ip", "protocol", "6", "0xff", "match", "u8", "0x05", "0x0f", "at", "0",
            "match", "u16", str(20 + 4 * words), "0xffff", "at", "2",
            "match", "u8", hex(words << 4), "0xf0", "at", "32", "flowid", "1:10")


def _classes(bits: float) -> list[list[str]]:
    """The `tc class add|change dev DEV` arguments of _shape's htb classes for a cap of `bits`/s: the link, the
    priority class of payload-free segments and the data class (a change restates every parameter)."""
    rate = f"{int(bits)}bit"
    return [["parent", "1:", "classid", "1:1", "htb", "rate", rate, "ceil", rate],
            ["parent", "1:1", "classid", "1:10", "htb", "rate", f"{int(bits / 10)}bit", "ceil", rate, "prio", "0"],
            ["parent", "1:1", "classid", "1:20", "htb", "rate", f"{int(bits * 0.9)}bit", "ceil", rate, "prio", "1"]]


def _set_rate(prefix: list[str], dev: str, bits: float) -> None:
    """Re-cap dev's shaper (built by _shape) at `bits`/s: its classes' rates and its data queue's length."""
    tc = [*prefix, "tc"]
    for cls in _classes(bits):
        _sh(*tc, "class", "change", "dev", dev, *cls)
    _sh(*tc, "qdisc", "change", "dev", dev, "parent", "1:20", "handle", "20:", "bfifo", "limit", str(_queue(bits)))


def _queue(bits: float) -> int:
    """Bytes of the data queue: QUEUE_S of the link, at least 64 KiB."""
    return max(64 << 10, int(bits / 8 * QUEUE_S))


def _our_namespaces(prefix: str) -> list[str]:
    out = _sh("ip", "netns", "list", check=False).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.split() and ln.split()[0].startswith(prefix)]


def _our_links(prefix: str) -> list[str]:
    out = _sh("ip", "-o", "link", "show", check=False).stdout
    names = [ln.split(":")[1].strip().split("@")[0] for ln in out.splitlines() if ln.count(":") >= 2]
    return [n for n in names if n.startswith(prefix)]


def cleanup(prefix: str = "gs-") -> list[str]:
    """Delete namespaces and root-namespace links whose names start with prefix; returns what went."""
    if not is_root():
        return []
    gone = []
    for ns in _our_namespaces(prefix):
        _sh("ip", "netns", "del", ns, check=False)
        gone.append(ns)
    for link in _our_links(prefix):  # veths die with their namespace; the bridge does not
        _sh("ip", "link", "del", link, check=False)
        gone.append(link)
    (STATE_DIR / f"testbed-{prefix}json").unlink(missing_ok=True)
    return gone


_SHAPER_STATS = re.compile(r"qdisc htb 1: root .*?\n\s*Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)")


def link_counters(prefix: list[str], dev: str) -> dict | None:
    """What crossed dev's shaper (htb on its egress) since the testbed came up: bytes, packets, dropped
    (the queue was full) and throttled (htb's overlimits: times it held a packet back because the link was
    at its cap). None when dev has no shaper of ours."""
    m = _SHAPER_STATS.search(_sh(*prefix, "tc", "-s", "qdisc", "show", "dev", dev, check=False).stdout)
    if m is None:
        return None
    return dict(zip(("bytes", "packets", "dropped", "throttled"), map(int, m.groups())))


def traffic_totals(hosts: dict) -> dict:
    """link_counters summed over status()'s namespaces and both ways (bytes, packets, dropped, throttled)."""
    ways = [c for h in hosts.values() for c in (h["sent"], h["received"]) if c]
    return {k: sum(c[k] for c in ways) for k in ("bytes", "packets", "dropped", "throttled")}


def _link_rate(prefix: list[str], dev: str) -> str | None:
    """The cap of dev's shaper as tc prints it ('80Mbit'), None when dev has none of ours."""
    m = re.search(r"class htb 1:1 root rate (\S+)", _sh(*prefix, "tc", "class", "show", "dev", dev, check=False).stdout)
    return m.group(1) if m else None


def status(prefix: str = "gs-") -> dict:
    """What exists now: namespaces, root links, the saved config, and per namespace its address, shaped
    rates ("rate" out, "rate_in" in) and link_counters in both directions ("sent": host to network,
    "received": network to host)."""
    state = STATE_DIR / f"testbed-{prefix}json"
    info = {"namespaces": {}, "links": _our_links(prefix) if is_root() else [],
            "config": json.loads(state.read_text()) if state.is_file() else None}
    for ns in _our_namespaces(prefix) if is_root() else []:
        ex = ["ip", "netns", "exec", ns]
        addr = _sh(*ex, "ip", "-o", "-4", "addr", "show", "dev", f"{prefix}eth", check=False).stdout.split()
        host_veth = f"{prefix}v{ns[len(prefix) + 1:]}"  # namespace {prefix}n{k} hangs off {prefix}v{k}
        info["namespaces"][ns] = {"address": addr[3] if len(addr) > 3 else None,
                                  "rate": _link_rate(ex, f"{prefix}eth"), "rate_in": _link_rate([], host_veth),
                                  "sent": link_counters(ex, f"{prefix}eth"), "received": link_counters([], host_veth)}
    return info
