"""Testbed: up builds shaped namespaces, a TCP transfer between two of them runs near the cap, down
leaves nothing; rate parsing and the non-root fallback need no privileges."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from gearshift.cluster import testbed as tbm
from gearshift.cluster.testbed import Testbed, TestbedConfig, cleanup, parse_rate, status
from gearshift.errors import ConfigError

PREFIX, SUBNET = "gt-", "10.213.8"  # distinct from the bench's gs- testbed

SERVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5599)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    t0 = t0 or time.perf_counter(); n += len(b)
print(n, time.perf_counter() - t0)
"""
CLIENT = "import socket, sys; s = socket.create_connection((sys.argv[1], 5599)); s.sendall(b'x' * (4 << 20))"
TINY = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5599)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(50):
    s.send(b"12345678"); time.sleep(0.002)
"""


def test_parse_rate() -> None:
    assert parse_rate("200mbit") == 200e6 and parse_rate("1gbit") == 1e9 and parse_rate("25mbps") == 200e6
    for bad in ("fast", "-1mbit", "10 parsecs"):
        with pytest.raises(ConfigError):
            parse_rate(bad)
    with pytest.raises(ConfigError):
        TestbedConfig(2, per_node_bandwidth=["1gbit"])
    with pytest.raises(ConfigError, match="testbed.per_node_ingress: expected 2 rates, got 1"):
        TestbedConfig(2, per_node_ingress=["1gbit"])
    both = TestbedConfig(2, bandwidth="80mbit", per_node_ingress=["10mbit", "20mbit"])
    assert (both.rate_bits(1), both.ingress_bits(1), TestbedConfig(2).ingress_bits(0)) == (80e6, 20e6, 1e9)
    for bad in (100, 1 << 20):
        with pytest.raises(ConfigError, match="testbed.max_packet: expected 1500..65536 bytes"):
            TestbedConfig(2, max_packet=bad)


def test_fallback_without_root(monkeypatch, capsys) -> None:
    monkeypatch.setattr(tbm, "is_root", lambda: False)
    with Testbed(TestbedConfig(3, prefix=PREFIX, subnet=SUBNET)) as tb:
        assert not tb.emulated and tb.address(2) == "127.0.0.1" and tb.command(1, ["true"]) == ["true"]
        assert tb.worker_env(1, 1234)["GLOO_SOCKET_IFNAME"] == "lo"
    assert len(capsys.readouterr().out.strip().splitlines()) == 1


def test_fallback_without_iproute2(monkeypatch, capsys) -> None:
    monkeypatch.setattr(tbm, "is_root", lambda: True)
    monkeypatch.setattr(tbm.shutil, "which", lambda name: None if name == "tc" else f"/usr/bin/{name}")
    with Testbed(TestbedConfig(2, prefix=PREFIX, subnet=SUBNET)) as tb:
        assert not tb.emulated and tb.address(1) == "127.0.0.1"
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "needs iproute2 (tc not found)" in out[0]


@pytest.mark.testbed
@pytest.mark.skipif(not tbm.is_root(), reason="the testbed needs root")
@pytest.mark.testbed
def test_up_shapes_and_down_cleans() -> None:
    cfg = TestbedConfig(2, 2, bandwidth="80mbit", prefix=PREFIX, subnet=SUBNET)
    with Testbed(cfg) as tb:
        st = status(PREFIX)
        assert set(st["namespaces"]) == {"gt-n0", "gt-n1"}
        assert st["namespaces"]["gt-n1"]["address"] == f"{SUBNET}.2/24"
        env = tb.worker_env(1, 29500)
        assert env["GLOO_SOCKET_IFNAME"] == "gt-eth" and env["MASTER_ADDR"] == f"{SUBNET}.1"
        for cmd in (tb.command(0, ["ip", "-d", "link", "show", "dev", "gt-eth"]),
                    ["ip", "-d", "link", "show", "dev", tb.host_veth(0)]):  # both directions: 16 KiB packets
            assert f"gso_max_size {16 << 10} " in subprocess.run(cmd, capture_output=True, text=True).stdout
        srv = tb.popen(1, [sys.executable, "-c", SERVER, tb.address(1)], stdout=subprocess.PIPE, text=True)
        try:
            assert srv.stdout.readline().strip() == "ready"
            subprocess.run(tb.command(0, [sys.executable, "-c", CLIENT, tb.address(1)]), check=True, timeout=30)
            nbytes, secs = srv.communicate(timeout=30)[0].split()
        finally:
            srv.kill()
        rate = int(nbytes) * 8 / float(secs)
        assert int(nbytes) == 4 << 20
        hosts = status(PREFIX)["namespaces"]  # the shapers counted the transfer, each way, at the cap
        assert hosts["gt-n0"]["sent"]["bytes"] > 4 << 20 and hosts["gt-n1"]["received"]["bytes"] > 4 << 20
        assert hosts["gt-n0"]["sent"]["throttled"] > 0 and hosts["gt-n1"]["received"]["throttled"] > 0
        assert hosts["gt-n1"]["sent"]["bytes"] < (4 << 20) // 10  # the way back carried ACKs only
        # the queue holds ~20 ms at the cap: a loaded machine may drop a few packets, never a share of the transfer
        assert hosts["gt-n0"]["sent"]["dropped"] < max(hosts["gt-n0"]["sent"]["packets"] // 20, 1)
        total = tbm.traffic_totals(hosts)  # both hosts, both ways: the transfer out and in, plus the ACKs
        assert total["bytes"] == sum(h[w]["bytes"] for h in hosts.values() for w in ("sent", "received"))
        assert total["bytes"] > 2 * (4 << 20) and total["throttled"] > 0
        assert 0.6 * 80e6 < rate < 1.1 * 80e6, f"measured {rate / 1e6:.1f} Mbit/s against an 80 Mbit/s cap"
        # only payload-free segments (ACKs) take the priority class: tiny data stays in its flow's order
        srv = tb.popen(1, [sys.executable, "-c", SERVER, tb.address(1)], stdout=subprocess.PIPE, text=True)
        try:
            assert srv.stdout.readline().strip() == "ready"
            subprocess.run(tb.command(0, [sys.executable, "-c", TINY, tb.address(1)]), check=True, timeout=30)
            assert srv.communicate(timeout=30)[0].split()[0] == "400"
        finally:
            srv.kill()
        classes = subprocess.run(tb.command(0, ["tc", "-s", "class", "show", "dev", "gt-eth"]), capture_output=True,
                                 text=True).stdout
        packets = {m[0]: int(m[1]) for m in re.findall(r"class htb (1:\d+) .*?\n Sent \d+ bytes (\d+) pkt", classes)}
        assert packets["1:20"] > 50 and packets["1:10"] < 10, packets  # the 50 tiny sends went with the bulk
    time.sleep(0.2)
    st = status(PREFIX)
    assert not st["namespaces"] and not st["links"] and st["config"] is None
    assert cleanup(PREFIX) == []


@pytest.mark.testbed
@pytest.mark.multiprocess
@pytest.mark.skipif(not tbm.is_root(), reason="the testbed needs root")
def test_monitor_measures_each_direction_of_an_asymmetric_link(tmp_path) -> None:
    """Host 1 sends at 20 Mbit/s and receives at 80 (host 0: 80 both ways): an adaptive job's measurement
    before training (the monitor's state in its first plan) sees the link 0 -> 1 about 4x faster than
    1 -> 0, each near its cap. A loose factor: shaped TCP on a shared 2-core machine. set_rate re-caps a
    direction in place."""
    from gearshift.train.config import load_config
    from gearshift.train.launch import launch
    from gearshift.train.metrics import read_metrics

    cfg = TestbedConfig(2, per_node_bandwidth=["80mbit", "20mbit"], per_node_ingress=["80mbit", "80mbit"],
                        prefix=PREFIX, subnet=SUBNET)
    job = load_config(None, ["--model.layers=2", "--model.width=128", "--model.heads=2", "--model.context=128",
                             "--train.batch_size=8", "--parallel.microbatches=2", "--data.max_bytes=100000",
                             "--cluster.workers=2", "--cluster.ranks_per_node=1", "--parallel.stages=2",
                             "--parallel.partition=adaptive",
                             "--adapt.every=0", "--train.steps=1", "--train.eval_every=0", "--output.trace=false",
                             "--output.progress=false", "--output.report=false", f"--output.dir={tmp_path / 'run'}"])
    with Testbed(cfg) as tb:
        assert launch(job, testbed=tb, quiet=True) == 0
        hosts = status(PREFIX)["namespaces"]
        assert (hosts["gt-n1"]["rate"], hosts["gt-n1"]["rate_in"]) == ("20Mbit", "80Mbit")
        tb.set_rate(1, out="40mbit", into="10mbit")
        hosts = status(PREFIX)["namespaces"]
        assert (hosts["gt-n1"]["rate"], hosts["gt-n1"]["rate_in"], hosts["gt-n0"]["rate"]) == \
            ("40Mbit", "10Mbit", "80Mbit")
    (plan,) = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r.get("event") == "plan"]
    (fwd,), (back,) = plan["measured"]["link_bandwidth"], plan["measured"]["link_bandwidth_back"]
    assert 0.4 * 80e6 / 8 < fwd < 1.3 * 80e6 / 8 and 0.4 * 20e6 / 8 < back < 1.3 * 20e6 / 8, (fwd, back)
    assert fwd > 2 * back, (fwd, back)


@pytest.mark.testbed
@pytest.mark.multiprocess
@pytest.mark.skipif(not tbm.is_root(), reason="the testbed needs root")
def test_monitor_follows_a_rate_change_and_bulk_flows(tmp_path) -> None:
    """Two hosts at 200 Mbit/s; from step 4 host 1's link at 40 Mbit/s, from step 7 back at 200 with 4 bulk TCP
    flows host 0 -> 1 (cluster.traffic, run by the launcher). The schedule chooser's probes every 3 steps see
    each: at most about 25 MB/s, then slower both ways and at most about 5 MB/s, then the flows' direction slower
    than the way back and its queue longer than before. After the job the flows are gone and the rate is back.
    Relations and the shaped rates' ceilings only: a loaded machine lowers what a probe measures, never raises
    it past the shaping."""
    from gearshift.train.config import load_config
    from gearshift.train.launch import launch
    from gearshift.train.metrics import read_metrics

    job = load_config(None, ["--model.layers=2", "--model.width=128", "--model.heads=2", "--model.context=128",
                             "--train.batch_size=8", "--parallel.microbatches=2", "--data.max_bytes=100000",
                             "--cluster.workers=2", "--cluster.ranks_per_node=1", "--parallel.stages=2",
                             "--cluster.testbed=true", "--parallel.schedule=auto", "--adapt.every=3",
                             "--adapt.link_change=0", '--cluster.traffic=["4:rate:1:40mbit", "7:rate:1:200mbit", '
                             '"7:flows:0:1:4"]', "--train.steps=9", "--train.eval_every=0", "--output.trace=false",
                             "--output.progress=false", "--output.report=false", f"--output.dir={tmp_path / 'run'}"])
    with Testbed(TestbedConfig(2, bandwidth="200mbit", prefix=PREFIX, subnet=SUBNET)) as tb:
        assert launch(job, testbed=tb, quiet=True) == 0
        hosts = status(PREFIX)["namespaces"]
        assert (hosts["gt-n1"]["rate"], hosts["gt-n1"]["rate_in"]) == ("200Mbit", "200Mbit")
        left = subprocess.run(["pgrep", "-f", "c.sendall"], capture_output=True, text=True).stdout.split()
        assert not left, "bulk flows outlived the job"
    applied = [json.loads(ln)["step"] for ln in (tmp_path / "run" / "traffic.jsonl").read_text().splitlines()]
    assert applied == [4, 7, 7]
    recs = {r["step"]: r["measured"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")
            if r.get("event") == "schedule"}
    assert sorted(recs) == [0, 3, 6, 9]
    (idle,), (slow,), (flows,) = (recs[s]["link_bandwidth"] for s in (3, 6, 9))
    (idle_b,), (slow_b,), (flows_b,) = (recs[s]["link_bandwidth_back"] for s in (3, 6, 9))
    assert max(idle, idle_b) < 1.3 * 25e6 and max(slow, slow_b) < 1.3 * 5e6, (idle, idle_b, slow, slow_b)
    assert slow < idle and slow_b < idle_b, (idle, slow, idle_b, slow_b)  # the rate cut, both ways
    assert flows < flows_b, (flows, flows_b)  # the flows' direction, not the way back
    assert recs[9]["link_latency"][0] > recs[3]["link_latency"][0], (recs[3], recs[9])  # their queue
