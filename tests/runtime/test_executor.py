"""The executor on one process (no messages): every op has a handler, stages on one rank hand activations and
gradients to each other and train like the unsplit model, and the forwards still waiting for their backward are
known by the weights they ran on."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from gearshift.runtime.executor import DeviceClock, PipelineExecutor, StepRecord, core_wait_s
from gearshift.schedules import Action, Op, Schedule, make_schedule

M = 4


def _mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((out - y) ** 2).mean()


def _data() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return list(torch.randn(2 * M, 6, generator=g).chunk(M)), list(torch.randn(2 * M, 3, generator=g).chunk(M))


def test_every_op_has_one_handler():
    assert set(PipelineExecutor._TRAINING) == set(Op)
    assert set(PipelineExecutor._EVALUATION) == set(PipelineExecutor._MEASURED) == set(Op)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "kfkb", "zb1p"])
def test_stages_on_one_rank_train_like_the_whole_model(name):
    torch.manual_seed(0)
    whole = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))
    stages = {0: whole[0:2], 1: whole[2:4], 2: whole[4:]}
    xs, ys = _data()
    sch = make_schedule(name, 3, M, k=2, placement=[0, 0, 0])
    ex = PipelineExecutor(sch, 0, stages, _mse, lambda s: ((2, 6), torch.float32))
    synced, stepped = [], []
    t0 = time.perf_counter()
    rec = ex.run(xs, ys, on_sync=lambda: synced.append(1), on_step=lambda: stepped.append(1))
    got = [p.grad.clone() for p in whole.parameters()]

    whole.zero_grad()
    losses = [_mse(whole(x), y) for x, y in zip(xs, ys)]
    (sum(losses) / M).backward()
    losses = [float(v.detach()) for v in losses]
    for g, p in zip(got, whole.parameters()):
        torch.testing.assert_close(g, p.grad)
    assert [float(x) for x in rec.losses] == pytest.approx(losses)  # kept on the device, read by mean_loss
    assert synced == stepped == [1]
    assert [label for label, _, _ in rec.events] == [a.label for a in sch.actions[0]]
    assert set(rec.compute_s) == {0, 1, 2} and rec.peak_act_bytes > 0 and ex.act_meter.held == 0
    for s in rec.compute_s:  # each stage's compute is its compute ops' spans (what DeviceClock writes on CUDA)
        spans = [e - b for (_, b, e), st, a in zip(rec.events, rec.event_stages, sch.actions[0])
                 if st == s and a.op.is_compute]
        assert rec.compute_s[s] == pytest.approx(sum(spans)) and all(x >= 0 for x in spans)
    assert 0 < rec.compute_cpu_s <= rec.cpu_s  # the compute's CPU is part of the process's over the step
    assert 0 <= rec.core_wait_s <= time.perf_counter() - t0  # ready without a core: within the step's wall time
    assert all(not st.saved and not st.inputs and not st.out_grads for st in ex.stage_states)
    # a split backward defers the linears' weight gradients (models.wgrad), except on the pipe's first stage, whose
    # whole backward is its BW: it keeps torch's linears
    deferred = {s for s, mod in stages.items() if any("_gearshift_deferred" in m.__dict__ for m in mod.modules())}
    assert deferred == ({1, 2} if name == "zb1p" else set())

    ev = PipelineExecutor(sch, 0, stages, _mse, lambda s: ((2, 6), torch.float32))
    with torch.no_grad():
        assert [float(x) for x in ev.run(xs, ys, forward_only=True).losses] == pytest.approx(losses)


def test_pending_backwards_name_the_forwards_on_a_module():
    torch.manual_seed(0)
    mod, other = nn.Linear(6, 3), nn.Linear(6, 3)
    sch = Schedule("forwards", 1, M, [0], [[Action(Op.FORWARD, 0, j) for j in (0, 2)]])
    ex = PipelineExecutor(sch, 0, {0: mod}, _mse, lambda s: ((2, 6), torch.float32))
    xs, ys = _data()
    ex.run(xs, ys)
    assert ex.pending_backwards(mod) == [(0, 0), (0, 2)]
    assert ex.pending_backwards(other) == []
    assert ex.act_meter.held > 0  # their saved activations are still held


def test_a_dropped_executor_is_freed_at_once():
    """Runtimes rebuild executors at every schedule change: no reference cycle may keep an old one (and its
    receive buffers) alive until the cycle collector runs."""
    import gc
    import weakref

    stages = {0: nn.Linear(6, 4), 1: nn.Linear(4, 3)}
    ex = PipelineExecutor(make_schedule("1f1b", 2, M, placement=[0, 0]), 0, stages, _mse,
                          lambda s: ((2, 6), torch.float32))
    ex.run(*_data())
    was_on = gc.isenabled()
    gc.disable()
    try:
        gone = weakref.ref(ex)
        del ex
        assert gone() is None
    finally:
        if was_on:
            gc.enable()


def test_core_wait_is_the_schedstat_run_queue_wait_and_zero_without_one(tmp_path):
    f = tmp_path / "schedstat"
    f.write_text("123456 4500000000 7\n")
    assert core_wait_s(str(f)) == 4.5
    assert core_wait_s(str(tmp_path / "missing")) == 0.0


class _FakeEvent:
    """A CUDA event on a fake device clock: recorded at the clock's time (ms), elapsed_time as CUDA's (ms)."""

    now = 0.0
    waits: list[float] = []

    def record(self) -> None:
        self.t = _FakeEvent.now

    def elapsed_time(self, end: _FakeEvent) -> float:
        return end.t - self.t

    def synchronize(self) -> None:
        _FakeEvent.waits.append(self.t)


def test_device_clock_writes_the_ops_device_spans_and_each_stages_compute_with_one_wait():
    _FakeEvent.now, _FakeEvent.waits = 5.0, []
    clock = DeviceClock(torch.device("cpu"), event=_FakeEvent)  # start at 5 ms
    rec = StepRecord()
    for stage, (b, e) in [(0, (6.0, 9.0)), (1, (9.0, 10.5)), (0, (12.0, 16.0))]:
        rec.events.append(("RECV", 0.0, 0.0))  # a traced op between the compute ops keeps its host span
        rec.event_stages.append(-1)
        _FakeEvent.now = b
        before = clock.mark()
        _FakeEvent.now = e
        clock.spans.append((len(rec.events), stage, before, clock.mark()))
        rec.events.append((f"F{stage}", 100.0, 200.0))  # the host's span, replaced
        rec.event_stages.append(stage)
    clock.read(rec)
    assert _FakeEvent.waits == [16.0]  # one wait, for the last event
    assert rec.compute_s == pytest.approx({0: 0.007, 1: 0.0015})
    assert [label for label, _, _ in rec.events[1::2]] == ["F0", "F1", "F0"]
    spans = [t for _, b, e in rec.events[1::2] for t in (b, e)]
    assert spans == pytest.approx([0.001, 0.004, 0.004, 0.0055, 0.007, 0.011])
    assert rec.events[0::2] == [("RECV", 0.0, 0.0)] * 3 and rec.busy_s == pytest.approx(0.0085)
    clock.read(rec)  # read once: a second read neither waits nor adds
    assert _FakeEvent.waits == [16.0] and rec.busy_s == pytest.approx(0.0085)


def test_the_executors_event_path_fills_the_cpu_paths_fields_with_one_wait_per_step(monkeypatch):
    """The CUDA path (an executor with a stream wait and no per-op hook) run on the CPU with fake events that tick
    1 ms per event: the stream is never waited for, the events once per step, and the record has the CPU path's
    fields (every action's span, each stage's compute from its ops' device spans)."""
    import gearshift.runtime.executor as executor

    class Ticking(_FakeEvent):
        def record(self) -> None:
            _FakeEvent.now += 1.0
            self.t = _FakeEvent.now

    _FakeEvent.now, _FakeEvent.waits = 0.0, []
    monkeypatch.setattr(executor, "DeviceClock", lambda device: DeviceClock(device, event=Ticking))
    stream_waits = []
    stages = {0: nn.Linear(6, 4), 1: nn.Linear(4, 3)}
    sch = make_schedule("1f1b", 2, M, placement=[0, 0])
    ex = PipelineExecutor(sch, 0, stages, _mse, lambda s: ((2, 6), torch.float32))
    ex.sync = lambda: stream_waits.append(1)  # what stream_sync gives on CUDA
    for _ in range(2):
        rec = ex.run(*_data())
    ops = sum(a.op.is_compute for a in sch.actions[0])
    assert stream_waits == [] and len(_FakeEvent.waits) == 2
    assert [label for label, _, _ in rec.events] == [a.label for a in sch.actions[0]]
    assert rec.busy_s == pytest.approx(ops * 1e-3) and set(rec.compute_s) == {0, 1}  # 1 ms between each op's events
    assert rec.compute_cpu_s > 0 and len(rec.losses) == M

    ex.after_compute = lambda stage, op, s, cpu: None  # the emulation hook: a wait around every op
    ex.run(*_data())
    assert len(stream_waits) == 2 * ops and len(_FakeEvent.waits) == 2
