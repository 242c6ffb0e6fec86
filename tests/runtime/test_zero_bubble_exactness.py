"""Zero-bubble and interleaved pipelines equal single-process training: zb1p (split backwards) on 4 stages and on
2 stages x 2 replicas, interleaved (2 stages per rank) and zbv (a V of 2 stages per rank) on 2 ranks x 2 replicas;
the same checks as test_exactness (losses, every parameter, the evaluation)."""

from __future__ import annotations

import pytest
from test_exactness import _check, _run_pipeline

from gearshift.testing import spawn

pytestmark = pytest.mark.multiprocess


def test_zero_bubble_pipelines_equal_single_process() -> None:
    runs = [("zb1p", 4, 1, 4), ("zb1p", 2, 1, 2), ("interleaved", 2, 1, 2), ("zbv", 2, 1, 2)]
    results = spawn(_run_pipeline, 4, runs)
    _check(results, runs, 4)
