import itertools
import random

import pytest

from gearshift.schedules import Action, Op, Schedule, ScheduleError, make_schedule, validate
from gearshift.schedules.multidir import direction_orders, drain, prologue, unroll
from gearshift.sim import ScheduleCosts, simulate

COMBOS = [(4, 2), (5, 2), (6, 2), (6, 3), (8, 2), (8, 3), (8, 4)]


def loads(orders):
    """Per rank: micro-batches its stages hold at once under 1F1B (P - position, summed over directions)."""
    P = len(orders[0])
    return [sum(P - o.index(r) for o in orders) for r in range(P)]


@pytest.mark.parametrize("P,D", COMBOS + [(10, 5), (16, 4), (7, 3)])
def test_direction_orders_are_permutations_and_no_rank_holds_a_slice_twice(P, D):
    orders = direction_orders(P, D)
    assert orders[0] == list(range(P)) and len(orders) == D
    assert all(sorted(o) == list(range(P)) for o in orders)
    for r in range(P):
        positions = [o.index(r) for o in orders]
        assert len(set(positions)) == D, f"rank {r} holds a slice twice: {positions}"


def test_two_directions_are_an_order_and_its_reverse():
    for P in (4, 6, 8, 16):
        assert direction_orders(P, 2) == [list(range(P)), list(range(P))[::-1]]


@pytest.mark.parametrize("P,D,worst", [(4, 2, 1.0), (8, 4, 1.0), (16, 4, 1.0), (6, 3, 1.1), (8, 3, 1.08), (7, 3, 1.2)])
def test_direction_orders_balance_activation_memory(P, D, worst):
    ld = loads(direction_orders(P, D))
    assert max(ld) / min(ld) <= worst + 1e-9, ld


def byte_loads(orders, w):
    """Per rank: bytes its stages hold at once under 1F1B ((P - position) x the slice's bytes, summed)."""
    P = len(orders[0])
    return [sum((P - o.index(r)) * w[o.index(r)] for o in orders) for r in range(P)]


def test_weighted_orders_balance_bytes_where_the_reverse_cannot():
    """The benchmark's even split of the GPT: slices 0 and 3 save about half a middle slice's bytes per
    micro-batch. The reverse leaves the middle ranks with both heavy slices; pairing 0 with 2 and 1 with 3
    does not."""
    w = [2.05, 4.0, 4.0, 2.5]
    rev = byte_loads([[0, 1, 2, 3], [3, 2, 1, 0]], w)
    orders = direction_orders(4, 2, slice_bytes=w)
    ld = byte_loads(orders, w)
    assert orders == [[0, 1, 2, 3], [2, 3, 0, 1]]
    assert max(rev) / min(rev) > 1.8 and max(ld) / min(ld) < 1.15, (rev, ld)
    # a front-heavy first slice: the reverse is the best there is (rank 0 pairs slice 0 with the lightest)
    assert direction_orders(4, 2, slice_bytes=[6.05, 2, 2, 2.5])[1] == [3, 2, 1, 0]


@pytest.mark.parametrize("P", [4, 5, 6])
def test_two_weighted_directions_are_the_best_assignment(P):
    """D = 2: the second order minimises the sum of squared byte loads over every permutation that gives no
    rank the same slice twice (brute force), for random weights."""
    rng = random.Random(P)
    for _ in range(5):
        w = [rng.randint(1, 1000) for _ in range(P)]
        got = sum(x * x for x in byte_loads(direction_orders(P, 2, slice_bytes=w), w))
        best = min(sum(x * x for x in byte_loads([list(range(P)), list(o)], w))
                   for o in itertools.permutations(range(P)) if all(o[i] != i for i in range(P)))
        assert got == best, w


@pytest.mark.parametrize("P,D", COMBOS + [(10, 5), (16, 4), (7, 3)])
def test_equal_weights_give_the_unweighted_orders(P, D):
    plain = direction_orders(P, D)
    assert direction_orders(P, D, slice_bytes=[3.5] * P) == plain
    assert direction_orders(P, D, slice_bytes=[1000.0] * (P - 1) + [1000.2]) == plain  # equal to 1 part in 1000


@pytest.mark.parametrize("P,D", [(6, 3), (8, 2), (8, 4)])
def test_weighted_orders_keep_each_rank_off_a_slice_twice_and_beat_the_unweighted(P, D):
    w = [1.0] + [3.0] * (P - 2) + [2.0]
    orders = direction_orders(P, D, slice_bytes=w)
    assert orders[0] == list(range(P)) and all(sorted(o) == list(range(P)) for o in orders)
    assert all(len({o.index(r) for o in orders}) == D for r in range(P))
    ld, plain = byte_loads(orders, w), byte_loads(direction_orders(P, D), w)
    assert sum(x * x for x in ld) < sum(x * x for x in plain) and max(ld) / min(ld) < max(plain) / min(plain)


def test_bad_slice_bytes_name_the_field():
    for bad in ([1.0, 2.0], [1.0, -1.0, 2.0, 3.0], [0, 0, 0, 0], [1.0, float("nan"), 1.0, 1.0]):
        with pytest.raises(ScheduleError, match="slice_bytes: needs 4 finite values >= 0"):
            make_schedule("multidir", 4, 4, directions=2, slice_bytes=bad)


@pytest.mark.parametrize("P,D", [(P, D) for P in range(4, 9) for D in range(2, P // 2 + 1)])
@pytest.mark.parametrize("update", ["flush", "async"])
def test_generated_multidir_schedules_are_valid(P, D, update):
    """Every list the generator makes up to 8 ranks (each D, three M), checked by the validator: the
    staleness bound (async: at most one version, a backward on its forward's version; flush: none) included."""
    for M in sorted({P, P + 1, 2 * P}):
        sch = make_schedule("multidir", P, M, directions=D, update=update)
        assert sch.num_stages == D * P and sch.stages_per_pipe == P and sch.num_pipes == D
        assert sch.window == (update == "async")
        validate(sch)  # structure, each batch's update in order, staleness, no deadlock (async: unrolled)
    w = [1.0] + [2.0 + (i % 3) for i in range(P - 2)] + [1.5]  # embedding light, blocks uneven, head between
    sch = make_schedule("multidir", P, P, directions=D, update=update, slice_bytes=w)
    assert sch.params["orders"] == direction_orders(P, D, slice_bytes=w) and sch.params["slice_bytes"] == w
    validate(sch)


def test_bad_requests_name_the_field():
    with pytest.raises(ScheduleError, match=r"directions: must be in 2..2 \(pipeline ranks / 2\) for 4 ranks, got 3"):
        make_schedule("multidir", 4, 4, directions=3)
    with pytest.raises(ScheduleError, match="num_microbatches: multidir needs at least 4 .* per direction, got 3"):
        make_schedule("multidir", 4, 3, directions=2)
    with pytest.raises(ScheduleError, match="update: 'later' is not one of flush, async"):
        make_schedule("multidir", 4, 4, update="later")


def test_flush_update_runs_after_the_batch_and_holds_optimizer_state_once():
    sch = make_schedule("multidir", 4, 4, directions=2)
    for r, acts in enumerate(sch.actions):
        ops = [a.op for a in acts]
        assert ops.count(Op.STEP) == 1 and ops.count(Op.NORM) == 1  # one slice stepped per rank
        step = next(a for a in acts if a.op is Op.STEP)
        assert step.stage == r  # the optimizer direction (0) is 0..P-1
        last_b = max(i for i, op in enumerate(ops) if op is Op.BACKWARD)
        assert ops.index(Op.NORM) > last_b and ops[-1] is Op.RECV_PAR
        # each stage's gradient leaves right after its last backward
        for s in sch.stages_of(r):
            red = next(i for i, a in enumerate(acts) if a.op is Op.REDUCE and a.stage == s)
            assert red > max(i for i, a in enumerate(acts) if a.op is Op.BACKWARD and a.stage == s)
            assert acts[red].peer == (-1 if s < 4 else sch.placement[s % 4])


def test_async_window_puts_the_update_inside_the_next_batch():
    sch = make_schedule("multidir", 4, 4, directions=2, update="async")
    M = sch.num_microbatches
    stale = 0
    for acts in sch.actions:
        installs = [i for i, a in enumerate(acts) if a.op is Op.RECV_PAR or (a.op is Op.STEP and a.stage >= 0)]
        fwds = [i for i, a in enumerate(acts) if a.op is Op.FORWARD]
        assert all(a.mb >= M for a in acts if a.op is Op.FORWARD)  # this batch's forwards
        stale += sum(f < installs[0] for f in fwds)  # ran before the new weights arrived
    assert stale > 0
    # the first step after a flush has no previous batch; the flush after the last has no new one
    assert all(a.mb >= M for acts in prologue(sch) for a in acts)
    assert all(a.mb < M and a.op is not Op.FORWARD for acts in drain(sch) for a in acts)


def test_unrolled_window_is_a_stream_of_batches_with_step_boundaries():
    sch = make_schedule("multidir", 4, 4, directions=2, update="async")
    flat = unroll(sch, steady=2)
    assert flat.num_microbatches == 3 * 4 and not flat.window
    assert all([a.op for a in acts].count(Op.BARRIER) == 3 for acts in flat.actions)
    assert all([a.op for a in acts].count(Op.STEP) == 3 for acts in flat.actions)  # one per batch


def edited(sch: Schedule, rank: int, fn) -> Schedule:
    actions = [list(a) for a in sch.actions]
    actions[rank] = fn(actions[rank])
    return Schedule(sch.name, sch.num_stages, sch.num_microbatches, sch.placement, actions, dict(sch.params),
                    sch.stages_per_pipe)


def moved(action: Action, before: Action):
    def fn(acts):
        acts.remove(action)
        acts.insert(acts.index(before), action)
        return acts
    return fn


def test_validator_catches_a_forward_two_versions_stale():
    sch = make_schedule("multidir", 4, 4, directions=2, update="async")
    rp = next(a for a in sch.actions[0] if a.op is Op.RECV_PAR)
    bad = edited(sch, 0, lambda acts: [a for a in acts if a != rp])
    with pytest.raises(ScheduleError, match=r"rank 0: F\d+@s7 runs batch 2 on version 0 of stage 7's weights"):
        validate(bad)


def test_validator_catches_a_flush_forward_on_new_weights():
    sch = make_schedule("multidir", 4, 4, directions=2)
    rp = next(a for a in sch.actions[1] if a.op is Op.RECV_PAR)
    first_f = next(a for a in sch.actions[1] if a.op is Op.FORWARD and a.stage == rp.stage)
    with pytest.raises(ScheduleError, match=r"F0@s6 runs batch 0 on version 1 .* \(must be: 0\)"):
        validate(edited(sch, 1, moved(rp, first_f)))


def test_validator_catches_an_install_over_weights_in_use():
    sch = make_schedule("multidir", 4, 4, directions=2)
    rp = next(a for a in sch.actions[2] if a.op is Op.RECV_PAR)
    last_b = [a for a in sch.actions[2] if a.op is Op.BACKWARD and a.stage == rp.stage][-1]
    # installing before the last backward but after every forward: a flush has one copy of the weights
    with pytest.raises(ScheduleError, match="awaits its backward"):
        validate(edited(sch, 2, moved(rp, last_b)))


def test_validator_catches_an_early_reduce_and_a_missing_transfer():
    sch = make_schedule("multidir", 4, 4, directions=2)
    red = next(a for a in sch.actions[3] if a.op is Op.REDUCE and a.stage == 4)
    last_b = [a for a in sch.actions[3] if a.op is Op.BACKWARD and a.stage == 4][-1]
    with pytest.raises(ScheduleError, match=r"RED@s4<->r0 for batch 0 comes after 3 of its 4 backwards"):
        validate(edited(sch, 3, moved(red, last_b)))
    sp = next(a for a in sch.actions[0] if a.op is Op.SEND_PAR)
    with pytest.raises(ScheduleError, match="SEND_PAR to rank 3 x0"):
        validate(edited(sch, 0, lambda acts: [a for a in acts if a != sp]))
    with pytest.raises(ScheduleError, match="SYNC and whole-rank STEP do not apply"):
        validate(edited(sch, 0, lambda acts: acts + [Action(Op.SYNC)]))


def test_validator_catches_a_norm_before_the_gradients():
    sch = make_schedule("multidir", 4, 4, directions=2)
    norm = next(a for a in sch.actions[1] if a.op is Op.NORM)
    rr = next(a for a in sch.actions[1] if a.op is Op.RECV_RED)
    with pytest.raises(ScheduleError, match="rank 1: NORM 0 runs before batch 0's gradient from rank 2 arrived"):
        validate(edited(sch, 1, moved(norm, rr)))


def test_multidir_beats_1f1b_on_bubbles_and_balances_memory_in_the_simulator():
    """Unit costs (F = 1, B = 2), one unit of activation memory per micro-batch and stage. P = 4, D = 2:
    Chimera's bubble ratio (P - 2) / (2N + P - 2) for N = 8 micro-batches is 1/9 (1F1B: (P - 1) / (N + P - 1) =
    3/11), and every rank holds between P/2 + 1 and P micro-batches' activations, not 1 to P."""
    def run(sch):
        return simulate(sch, ScheduleCosts.uniform(sch.num_stages, sch.num_ranks, act_mem=1.0))

    one = run(make_schedule("1f1b", 4, 8))
    flush = run(make_schedule("multidir", 4, 4, directions=2))
    window = run(make_schedule("multidir", 4, 4, directions=2, update="async"))
    assert one.iteration_s == 33 and one.bubble_fraction == pytest.approx(3 / 11)
    assert flush.iteration_s == 27 and flush.bubble_fraction == pytest.approx(1 / 9)
    assert window.iteration_s < flush.iteration_s
    assert one.peak_act_bytes == [4, 3, 2, 1]
    for res in (flush, window):
        peaks = res.peak_act_bytes
        assert all(3 <= p <= 5 for p in peaks) and max(peaks) / min(peaks) <= 1.25
    d3 = run(make_schedule("multidir", 6, 6, directions=3))
    assert max(d3.peak_act_bytes) / min(d3.peak_act_bytes) <= 1.1 and d3.iteration_s < run(
        make_schedule("1f1b", 6, 18)).iteration_s


def test_weighted_orders_balance_the_simulated_peaks():
    """The simulator's per-rank activation peaks (unit costs, each slice's bytes per micro-batch as in the
    benchmark's even split) under the weighted orders, flush and async, against the reverse's."""
    w = [2.05, 4.0, 4.0, 2.5]

    def peaks(sch):
        cost = ScheduleCosts.uniform(sch.num_stages, sch.num_ranks)
        cost.act_mem_bytes = [w[s % 4] for s in range(sch.num_stages)]
        res = simulate(sch, cost)
        return max(res.peak_act_bytes) / min(res.peak_act_bytes)

    for update in ("flush", "async"):
        assert peaks(make_schedule("multidir", 4, 8, directions=2, update=update, slice_bytes=w)) < 1.3
        assert peaks(make_schedule("multidir", 4, 8, directions=2, update=update)) > 1.6


def test_schedule_with_pipes_round_trips():
    sch = make_schedule("multidir", 4, 4, directions=2, update="async")
    again = Schedule.from_dict(sch.to_dict())
    assert again == sch and again.stages_per_pipe == 4 and again.window
    assert make_schedule("1f1b", 4, 4).to_dict().get("stages_per_pipe") is None
