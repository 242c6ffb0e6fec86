"""The simulator's multi-directional semantics: update messages priced like pipeline transfers, NORM as a
collective that every slice's STEP waits for, step boundaries (BARRIER), and a window's carried state."""

from gearshift.schedules import Op, make_schedule
from gearshift.schedules.multidir import unroll
from gearshift.sim import ScheduleCosts, simulate


def cost(sch, param_bytes: float = 0.0, bandwidth: float = float("inf"), act_mem: float = 0.0) -> ScheduleCosts:
    c = ScheduleCosts.uniform(sch.num_stages, sch.num_ranks, bandwidth=bandwidth, act_mem=act_mem)
    c.param_bytes = [param_bytes] * sch.num_stages
    return c


def test_update_messages_move_a_slice_over_the_links():
    sch = make_schedule("multidir", 4, 4, directions=2)
    free = simulate(sch, cost(sch))
    priced = simulate(sch, cost(sch, param_bytes=100.0, bandwidth=100.0))
    moved = [(a.op, end - start) for a, _, _, start, end in priced.transfers if a.op in (Op.REDUCE, Op.SEND_PAR)]
    assert sorted({op for op, _ in moved}) == [Op.REDUCE, Op.SEND_PAR] and len(moved) == 8
    assert all(d == 1.0 for _, d in moved)  # 100 bytes at 100 bytes/s
    assert priced.iteration_s >= free.iteration_s + 1  # the parameters' trip back is never hidden under flush
    for r, line in enumerate(priced.timelines):  # a receive ends when its message is there
        for a, start, end in line:
            if a.op is Op.RECV_RED:
                sent = next(x for x in priced.transfers if x[0].op is Op.REDUCE and x[1] == a.peer and x[2] == r)
                assert end == max(start, sent[4])


def test_every_step_waits_for_every_norm():
    sch = make_schedule("multidir", 4, 4, directions=2)
    res = simulate(sch, cost(sch, param_bytes=100.0, bandwidth=50.0))
    norms = [end for line in res.timelines for a, _, end in line if a.op is Op.NORM]
    steps = [end for line in res.timelines for a, _, end in line if a.op is Op.STEP]  # STEP waits, then steps
    assert len(norms) == len(steps) == 4 and min(steps) == max(norms) and min(norms) < max(norms)
    broken = make_schedule("multidir", 4, 4, directions=2)
    broken.actions[2] = [a for a in broken.actions[2] if a.op is not Op.NORM]
    stuck = simulate(broken, cost(broken)).deadlock
    assert stuck and {a.op for _, a in stuck} >= {Op.STEP}


def test_barriers_hold_every_rank_until_all_arrive():
    flat = unroll(make_schedule("multidir", 4, 4, directions=2, update="async"))
    res = simulate(flat, cost(flat))
    assert not res.deadlock
    for k in range(3):
        arrive = []
        leave = []
        for line in res.timelines:
            i = [j for j, (a, _, _) in enumerate(line) if a.op is Op.BARRIER][k]
            arrive.append(line[i - 1][2])
            leave.append(line[i][2])
        assert min(leave) == max(leave) == max(arrive)


def test_a_window_starts_holding_its_previous_batch():
    sch = make_schedule("multidir", 4, 4, directions=2, update="async")
    res = simulate(sch, cost(sch, act_mem=1.0))
    assert not res.deadlock
    M = sch.num_microbatches
    for r, acts in enumerate(sch.actions):
        carried = sum(1 for a in acts if a.op is Op.BACKWARD and a.mb < M)  # tails: forwards ran last step
        assert res.peak_act_bytes[r] >= carried
    assert res.peak_act_bytes == [5.0] * 4  # P + 1 micro-batches on every rank


def test_update_ops_on_shared_cores():
    """The global-clock driver (four ranks sharing two cores) replays a multidir schedule's updates: every STEP
    after every NORM, every update receive after its message arrives, slower than with a core each."""
    for update in ("flush", "async"):
        for sch in (make_schedule("multidir", 4, 4, directions=2, update=update),
                    unroll(make_schedule("multidir", 4, 4, directions=2, update=update))):
            alone = cost(sch, param_bytes=100.0, bandwidth=50.0, act_mem=1.0)
            alone.step_s = 0.5
            shared = cost(sch, param_bytes=100.0, bandwidth=50.0, act_mem=1.0)
            shared.step_s, shared.host, shared.cores = 0.5, [0, 0, 0, 0], [2.0]
            a, res = simulate(sch, alone), simulate(sch, shared)
            assert not res.deadlock and res.iteration_s > a.iteration_s
            assert res.peak_act_bytes == a.peak_act_bytes
            norms = [[end for x, _, end in line if x.op is Op.NORM] for line in res.timelines]
            steps = [[start for x, start, _ in line if x.op is Op.STEP] for line in res.timelines]
            for j in range(len(steps[0])):  # each rank's j-th STEP waits for every rank's j-th NORM
                assert min(st[j] for st in steps) >= max(ns[j] for ns in norms)
            arrived = {}
            for x, src, dst, _, end in res.transfers:
                if x.op in (Op.REDUCE, Op.SEND_PAR):
                    arrived.setdefault((x.op, src, dst), []).append(end)
            for r, line in enumerate(res.timelines):
                for x, _, end in line:
                    if x.op in (Op.RECV_RED, Op.RECV_PAR):
                        sent = Op.REDUCE if x.op is Op.RECV_RED else Op.SEND_PAR
                        assert end >= min(arrived[(sent, x.peer, r)])
