"""comm.doorbell between two real processes: messages arrive under their tag and call whatever the order,
a sender two calls ahead waits instead of overwriting, and a dead or silent peer raises instead of hanging."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

from gearshift.comm import doorbell
from gearshift.comm.doorbell import Doorbells

pytestmark = pytest.mark.skipif(not doorbell.available(), reason="futex doorbells need Linux on x86-64/arm64")
CTX = mp.get_context("fork")  # the children need only this module; fork keeps the test fast


def _pair(index: int, conn) -> Doorbells:
    """This process's doorbells, opened to the other end of conn."""
    bells = Doorbells(2, index)
    conn.send((os.getpid(), bells.fd))
    pid, fd = conn.recv()
    bells.open_peer(1 - index, pid, fd)
    conn.send("ready")
    conn.recv()
    return bells


def _echo(conn, calls: int, tags: list[int]) -> None:
    """Per call: take every tag (in the order given) and send back value + 1 under the same tag."""
    bells = _pair(1, conn)
    for _ in range(calls):
        bells.next_call([1 - bells.index])
        for tag in tags:
            bells.send(0, tag, bells.recv(0, tag) + 1)
    conn.send("done")


def _start(target, *args):
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=target, args=(child, *args))
    proc.start()
    return proc, _pair(0, parent), parent


def test_messages_match_by_call_and_tag_in_any_order() -> None:
    tags = [5, 0, 16383, 1024, 7]
    proc, bells, conn = _start(_echo, 3, tags)
    try:
        for call in range(3):
            bells.next_call([1 - bells.index])
            for tag in reversed(tags):  # sent in the opposite order to the one the peer takes them in
                bells.send(1, tag, 1000 * call + tag)
            got = {tag: bells.recv(1, tag) for tag in tags}
            assert got == {tag: 1000 * call + tag + 1 for tag in tags}
        assert conn.recv() == "done"
    finally:
        proc.join(10)
    assert proc.exitcode == 0


def _one_way(conn, calls: int) -> None:
    """Send tag 0 in `calls` calls without reading anything (a one-way ring's sender runs ahead)."""
    bells = _pair(1, conn)
    for call in range(calls):
        bells.next_call([1 - bells.index])
        bells.send(0, 0, call)
    conn.send("sent")


def test_a_sender_two_calls_ahead_waits_for_the_slot() -> None:
    proc, bells, conn = _start(_one_way, 3)
    try:
        assert not conn.poll(0.3)  # the third send waits: call 0's message is still unread
        got = []
        for _ in range(3):
            bells.next_call([1 - bells.index])
            got.append(bells.recv(1, 0))
        assert got == [0, 1, 2] and conn.recv() == "sent"
    finally:
        proc.join(10)


def _exit_at_once(conn) -> None:
    _pair(1, conn)
    os._exit(3)


def test_a_dead_peer_raises_instead_of_hanging() -> None:
    proc, bells, _ = _start(_exit_at_once)
    proc.join(10)
    bells.next_call([1 - bells.index])
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="exited"):
        bells.recv(1, 3)
    assert time.monotonic() - t0 < 2


def _silent(conn) -> None:
    _pair(1, conn)
    conn.recv()


def test_a_silent_peer_times_out() -> None:
    proc, bells, conn = _start(_silent)
    try:
        bells.next_call([1 - bells.index])
        with pytest.raises(TimeoutError, match="tag 9"):
            bells.recv(1, 9, timeout_s=0.2)
        with pytest.raises(ValueError, match="tag"):
            bells.send(1, doorbell.SLOTS, 0)
        with pytest.raises(ValueError, match="value"):
            bells.send(1, 0, 1 << doorbell.VALUE_BITS)
    finally:
        conn.send("bye")
        proc.join(10)
