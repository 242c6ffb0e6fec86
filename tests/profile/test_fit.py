"""The robust line fit (Theil-Sen) and the Calibration built on it: pure, no torch."""

import random

import pytest

from gearshift.profile.calibration import Calibration
from gearshift.profile.fit import LineFit, theil_sen


def least_squares(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def test_an_exact_line_is_recovered_with_zero_residual():
    xs = [0.001, 0.002, 0.004, 0.008]
    fit = theil_sen(xs, [1.2 * x + 0.0011 for x in xs])
    assert (fit.slope, fit.intercept) == (pytest.approx(1.2), pytest.approx(0.0011))
    assert fit.residual == pytest.approx(0.0, abs=1e-12)
    assert (fit.points, fit.sizes, fit.method) == (4, 4, "theil-sen")
    assert fit(0.01) == pytest.approx(0.0131)


def test_one_noisy_point_moves_neither_slope_nor_the_sign_of_the_intercept():
    xs = [0.001, 0.0015, 0.002, 0.003, 0.004, 0.006, 0.008]
    ys = [1.2 * x + 0.001 for x in xs]
    ys[-1] *= 1.8  # a burst of other load on the largest size
    ls_slope, ls_icpt = least_squares(xs, ys)
    assert ls_icpt < 0  # least squares flips the fixed cost's sign
    fit = theil_sen(xs, ys)
    assert fit.slope == pytest.approx(1.2, rel=0.15) and fit.intercept == pytest.approx(0.001, rel=0.3)
    assert abs(fit.slope - 1.2) < abs(ls_slope - 1.2)


def test_noise_on_many_points_stays_near_the_line():
    rng = random.Random(3)
    xs = [0.001 * (1 + i % 8) for i in range(40)]
    ys = [(1.1 * x + 0.0005) * (1 + abs(rng.gauss(0, 0.03))) for x in xs]  # a shared machine only adds time
    fit = theil_sen(xs, ys)
    assert fit.slope == pytest.approx(1.1, rel=0.1) and 0 < fit.intercept < 0.001
    assert fit.residual < 0.05


def test_a_negative_intercept_or_one_size_fits_through_the_origin():
    xs = [0.001, 0.002, 0.004]
    fit = theil_sen(xs, [2 * x - 0.0005 for x in xs])  # a line below the origin: no negative fixed cost
    assert fit.intercept == 0.0 and fit.method == "theil-sen through 0"
    assert fit.slope == pytest.approx(sorted((2 * x - 0.0005) / x for x in xs)[1])
    one = theil_sen([0.002, 0.002], [0.003, 0.005])
    assert (one.slope, one.intercept, one.sizes) == (pytest.approx(2.0), 0.0, 1)
    with pytest.raises(ValueError, match="x > 0"):
        theil_sen([0.0], [1.0])


def test_calibration_fits_each_position_and_round_trips():
    pts = [[(x, 1.5 * x + 0.002) for x in (0.01, 0.02, 0.04)], [(x, 1.0 * x) for x in (0.01, 0.03)]]
    cal = Calibration.fit(pts, wait_cpu=0.25, latency_s=[1e-4])
    assert cal.compute_s(0, 0.02) == pytest.approx(0.032)
    assert cal.compute_s(1, 0.02) == pytest.approx(0.02)
    assert cal.compute_s(0, 0.0) == 0.0  # no work, no action
    back = Calibration.from_dict(cal.to_dict())
    assert back == cal and isinstance(back.lines[0], LineFit)
    assert cal.per_op_s == pytest.approx(0.002)  # the median position's intercept


def test_a_pooled_calibration_fits_one_line_through_every_position():
    line = [(x, 1.2 * x + 0.001) for x in (0.01, 0.02, 0.03, 0.04, 0.05, 0.06)]
    line[3] = (0.04, 0.09)  # a burst of load on one position's point
    pts = [line[:2], line[2:4], line[4:]]
    cal = Calibration.fit(pts, pooled=True)
    assert cal.lines[0] == cal.lines[1] == cal.lines[2] and cal.lines[0].points == 6 and cal.meta["pooled"]
    assert cal.lines[0].slope == pytest.approx(1.2) and cal.lines[0].intercept == pytest.approx(0.001)
