"""The gradient-sync keys of [parallel]: node_matrix, shm and send_thread parse, validate in one line, and
map onto the comm API's parameters (node_matrix -> matrix, send_thread "auto" -> None)."""

from __future__ import annotations

import pytest

from gearshift.cluster.topology import parse_matrix
from gearshift.errors import ConfigError
from gearshift.train.config import load_config


def test_defaults_leave_the_choice_to_the_comm_layer() -> None:
    s = load_config(None, []).parallel.sync
    assert (s.node_matrix, s.shm, s.send_thread) == ("auto", True, "auto")
    assert parse_matrix(s.node_matrix) is None and (s.matrix, s.threaded) == (None, None)


@pytest.mark.parametrize("text,shape", [("2x4", (2, 4)), ("1 x 7", (1, 7)), ("3X1", (3, 1))])
def test_a_pinned_matrix_parses(text: str, shape: tuple[int, int]) -> None:
    cfg = load_config(None, [f'--parallel.node_matrix="{text}"', "--parallel.send_thread=false",
                             "--parallel.shm=false"])
    s = cfg.parallel.sync
    assert parse_matrix(s.node_matrix) == shape == s.matrix
    assert s.send_thread is False and s.threaded is False and s.shm is False


@pytest.mark.parametrize("override,message", [
    ("--parallel.node_matrix=square", "parallel.node_matrix: 'square' (allowed: auto, or RxC with R, C >= 1"),
    ('--parallel.node_matrix="0x4"', "parallel.node_matrix: '0x4' (allowed: auto, or RxC"),
    ("--parallel.send_thread=1", "parallel.send_thread: 1 (allowed: auto, true, false)"),
    ("--parallel.shm=maybe", "parallel.shm: expected true or false, got 'maybe'"),
])
def test_bad_values_are_one_line(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_keys_reach_the_sync_policy() -> None:
    from gearshift.train.build import grad_sync

    cfg = load_config(None, ['--parallel.node_matrix="2x1"', "--parallel.shm=false", "--parallel.send_thread=true",
                             "--parallel.stages=1", "--parallel.microbatches=1"])
    s = grad_sync(cfg).settings
    assert (s.matrix, s.shm, s.threaded) == ((2, 1), False, True)
