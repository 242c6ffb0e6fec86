"""The price of gradient sync overlapped with the last backward: what the backward hides, and what it cannot."""

from __future__ import annotations

import pytest

from gearshift.sim.overlap import exposed_sync_s, sync_s


def test_after_backward_is_the_sum_and_one_bucket_hides_nothing() -> None:
    assert sync_s([1.0, 2.0], [10, 10], 5.0, overlap=False) == 3.0
    assert exposed_sync_s([2.0], [100], 5.0) == pytest.approx(2.0)  # ready when the backward ends
    assert exposed_sync_s([1.0, 2.0], [10, 10], 0.0) == 3.0


def test_buckets_hide_behind_the_backward_in_reverse_order() -> None:
    # 4 equal buckets, backward 4 s: the last bucket is ready at 1 s, the first at 4 s
    assert exposed_sync_s([0.5] * 4, [1] * 4, 4.0) == pytest.approx(0.5)  # only the first bucket is exposed
    # slow links: the all-reduces queue behind each other, the backward hides its own length at most
    assert exposed_sync_s([3.0] * 4, [1] * 4, 4.0) == pytest.approx(1.0 + 12.0 - 4.0)
    # a big first bucket (the embedding) is ready last and stays exposed whatever the link
    assert exposed_sync_s([0.1, 0.1, 2.0], [1, 1, 8], 10.0) == pytest.approx(0.1 + 0.1)
    assert exposed_sync_s([2.0, 0.1, 0.1], [8, 1, 1], 10.0) == pytest.approx(2.0)
    # the emulation's sleep after the backward's compute hides what is left, up to its length
    assert exposed_sync_s([2.0, 0.1, 0.1], [8, 1, 1], 10.0, tail_s=1.5) == pytest.approx(0.5)
    assert exposed_sync_s([2.0, 0.1, 0.1], [8, 1, 1], 10.0, tail_s=30.0) == 0.0


def test_overlap_never_costs_more_than_after_backward() -> None:
    for times, sizes, b in (([1.0, 1.0], [1, 3], 0.5), ([0.2] * 5, [5, 4, 3, 2, 1], 7.0), ([9.0], [1], 1.0)):
        assert 0.0 <= exposed_sync_s(times, sizes, b) <= sum(times)
    with pytest.raises(ValueError, match="2 bucket times for 1 buckets"):
        exposed_sync_s([1.0, 1.0], [1], 1.0)


def test_blocking_calls_pay_their_fixed_cost_and_overlapped_ones_do_not() -> None:
    assert sync_s([1.0, 2.0], [10, 10], 5.0, overlap=False, call_s=0.25) == pytest.approx(3.5)
    assert sync_s([1.0, 2.0], [10, 10], 0.0, overlap=True, call_s=0.25) == pytest.approx(3.0)


def test_a_fit_of_measured_calls_gives_back_the_link_and_the_call_cost() -> None:
    from gearshift.sim.collectives import LinkCosts, predict
    from gearshift.sim.overlap import fit_blocking_calls

    beta, call = 1 / 22e6, 1.7e-3  # a link slower than its nominal rate, a call's round trips
    costs = LinkCosts(inter_alpha=1e-6, inter_beta=beta)  # bandwidth-bound: gloo's price is 2 (n-1)/n S b
    sizes = [2.0 ** k for k in range(18, 23)]
    times = [call + predict("gloo", s, [1] * 4, costs) for s in sizes]
    got_beta, got_call = fit_blocking_calls(sizes, times, 4)
    assert got_beta == pytest.approx(beta, rel=1e-3) and got_call == pytest.approx(call, rel=1e-2)
    # priced back with the fitted link, a blocking sync costs what was measured
    fitted = LinkCosts(inter_alpha=1e-6, inter_beta=got_beta)
    buckets = [300e3, 450e3]
    assert sync_s([predict("gloo", b, [1] * 4, fitted) for b in buckets], buckets, 0.1, overlap=False,
                  call_s=got_call) == pytest.approx(sum(call + predict("gloo", b, [1] * 4, costs) for b in buckets),
                                                    rel=1e-3)
    # noise never gives a negative link or call cost
    assert fit_blocking_calls([1e5, 2e5], [0.02, 0.01], 4)[0] == 0.0
    assert fit_blocking_calls([1e5, 2e5], [0.001, 0.1], 4)[1] == 0.0
    with pytest.raises(ValueError, match="at least 2 sizes"):
        fit_blocking_calls([1e5, 1e5], [0.01, 0.01], 4)
    with pytest.raises(ValueError, match="ranks must be >= 2"):
        fit_blocking_calls([1e5, 2e5], [0.01, 0.02], 1)
