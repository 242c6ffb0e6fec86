"""Cluster spec parsing: the example file, defaults, and every error naming its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gearshift.cluster.spec import GB, ClusterSpec, Network, load_spec, parse_spec
from gearshift.cluster.state import ClusterState
from gearshift.errors import SpecError

EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "cluster_mixed.toml"
TYPES = {"A": {"speed": 1.0, "memory_gb": 40}, "B": {"speed": 0.5, "memory_gb": 8}}


def test_example_spec_loads():
    spec = load_spec(EXAMPLE)
    assert spec.world_size == 8 and spec.num_nodes == 2
    assert [d.kind for d in spec.devices] == ["A100", "A100", "T4", "T4", "T4", "P4", "P4", "P4"]
    assert spec.devices[3].nic_hops == 2 and spec.devices[4].node == 1 and spec.devices[4].local_rank == 0
    assert spec.devices[0].memory_bytes == 40 * GB
    assert spec.bandwidth(0, 1) == 100 * GB / 8 and spec.bandwidth(3, 4) == 10 * GB / 8
    assert spec.latency(3, 4) == pytest.approx(20e-6)
    state = ClusterState.from_spec(spec)
    assert state.speeds[5] == 0.15 and state.bandwidth[2][2] == float("inf")


def test_network_defaults():
    spec = parse_spec({"types": TYPES, "nodes": [{"devices": ["A", "B"]}]})
    d, n = Network(), spec.network
    assert (n.intra_bandwidth, n.inter_bandwidth) == pytest.approx((d.intra_bandwidth, d.inter_bandwidth))
    assert (n.intra_latency, n.inter_latency) == pytest.approx((d.intra_latency, d.inter_latency))
    assert [d.nic_hops for d in spec.devices] == [0, 0]
    assert n.nic_bandwidth == float("inf")  # no card cap unless nic_gbps is given


def test_card_bandwidth_prices_shared_flows():
    from gearshift.sim.collectives import LinkCosts

    spec = parse_spec({"types": TYPES, "nodes": [{"devices": ["A"]}],
                       "network": {"inter_gbps": 100, "nic_gbps": 200, "inter_latency_us": 10}})
    c = LinkCosts.from_network(spec.network)
    assert c.nic_bandwidth == 200 * GB / 8 and c.inter_alpha == pytest.approx(10e-6)
    assert c.inter_beta_shared(1) == pytest.approx(8 / (100 * GB))  # one flow: its own rate
    assert c.inter_beta_shared(4) == pytest.approx(4 * 8 / (200 * GB))  # four flows share the card


def test_constructors():
    assert ClusterSpec.uniform(4, ranks_per_node=2).num_nodes == 2
    assert [d.speed for d in ClusterSpec.from_speeds([1.0, 2.0]).devices] == [1.0, 2.0]


@pytest.mark.parametrize("data, msg", [
    ({"types": TYPES, "nodes": [{"devices": ["A"]}], "gpus": {}}, "unknown section 'gpus'"),
    ({"nodes": [{"devices": ["A"]}]}, r"\[types\] is missing"),
    ({"types": {"A": {"memory_gb": 1}}, "nodes": [{"devices": ["A"]}]}, r"types.A.speed: missing"),
    ({"types": {"A": {"speed": "fast", "memory_gb": 1}}, "nodes": [{"devices": ["A"]}]},
     r"types.A.speed: expected a number, got 'fast'"),
    ({"types": {"A": {"speed": True, "memory_gb": 1}}, "nodes": [{"devices": ["A"]}]}, "types.A.speed"),
    ({"types": {"A": {"speed": float("nan"), "memory_gb": 1}}, "nodes": [{"devices": ["A"]}]},
     r"types.A.speed: expected a number, got nan"),
    ({"types": {"A": {"speed": 1, "memory_gb": 0}}, "nodes": [{"devices": ["A"]}]},
     r"types.A.memory_gb: must be > 0, got 0"),
    ({"types": TYPES}, r"\[\[nodes\]\] is missing"),
    ({"types": TYPES, "nodes": [{"devices": []}]}, r"nodes\[0\].devices: expected a non-empty list"),
    ({"types": TYPES, "nodes": [{"devices": ["A"]}, {}]}, r"nodes\[1\].devices"),
    ({"types": TYPES, "nodes": [{"devices": ["A", "B"], "nic_hops": [0]}]},
     r"nodes\[0\].nic_hops: expected a list of 2 integers"),
    ({"types": TYPES, "nodes": [{"devices": ["A"], "nic_hops": [-1]}]},
     r"nodes\[0\].nic_hops: expected integers"),
    ({"types": TYPES, "nodes": [{"devices": ["C"]}]},
     r"nodes\[0\].devices: unknown type 'C' \(defined: A, B\)"),
    ({"types": TYPES, "nodes": [{"devices": ["A"]}], "network": {"inter_gbps": -5}},
     r"network.inter_gbps: must be > 0"),
    ({"types": TYPES, "nodes": [{"devices": ["A"]}], "network": {"nic_gbs": 100}},
     r"network.nic_gbs: unknown key \(allowed: .*nic_gbps"),
])
def test_errors_name_the_field(data, msg):
    with pytest.raises(SpecError, match=msg):
        parse_spec(data)


def test_load_spec_errors(tmp_path):
    with pytest.raises(SpecError, match="cluster.spec: file not found"):
        load_spec(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[types\nspeed = ")
    with pytest.raises(SpecError, match="is not valid TOML"):
        load_spec(bad)
