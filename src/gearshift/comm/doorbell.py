"""Doorbells between the processes of one node: a message (a tag and a 40-bit value, e.g. an offset into
comm.shm's arena) is written into a mailbox in shared memory and the receiver sleeps on a futex, instead
of an 8-byte gloo message over loopback TCP: one wake-up instead of two (gloo's I/O thread, then the
waiting thread), which matters most where processes share the cores (docs/benchmarks.md).

Each rank owns one memfd with a box per rank of its node (the messages it sends to that rank); a box is
a bell word (bumped and woken on every message) and two windows of slots, one per call parity, indexed
by tag. The receiver clears a slot when it reads it, and a sender waits for a slot to be clear before it
fills it, so no message is lost even where a sender runs two calls ahead (a one-way ring).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import sys
import time

SLOTS = 1 << 14  # tags per call window: comm.stream's segment * TAG_STRIDE + step
HEADER = 64  # the bell word, alone on its cache line
BOX_BYTES = HEADER + 2 * SLOTS * 8
VALUE_BITS = 40  # values (byte offsets) below 1 TiB; the call's sequence number above
SEQ_MASK = (1 << 22) - 1
POLL_S = 0.02  # a waiting rank wakes this often to check that its peer lives (and for missed bells)
TIMEOUT_S = 1800.0  # as torch.distributed's default: then a wait raises instead of hanging
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # not the PRIVATE forms: the word is shared by two processes
_NR_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower())
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def available() -> bool:
    """Whether this platform has futexes we know how to call (Linux on x86-64 or arm64)."""
    return _libc is not None and _NR_FUTEX is not None


def _futex(addr: int, op: int, val: int, timeout: _Timespec | None = None) -> None:
    _libc.syscall(ctypes.c_long(_NR_FUTEX), ctypes.c_void_p(addr), ctypes.c_long(op), ctypes.c_long(val),
                  ctypes.byref(timeout) if timeout is not None else ctypes.c_void_p(0), ctypes.c_void_p(0),
                  ctypes.c_long(0))


class _Box:
    """One sender -> receiver mailbox inside a mapped memfd."""

    def __init__(self, mm: mmap.mmap, index: int) -> None:
        base = index * BOX_BYTES
        self.bell = ctypes.c_int32.from_buffer(mm, base)
        self.bell_addr = ctypes.addressof(self.bell)
        self.slots = (ctypes.c_int64 * (2 * SLOTS)).from_buffer(mm, base + HEADER)


def process_alive(pid: int) -> bool:
    """Whether pid runs (not gone, not a zombie waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


class Doorbells:
    """This rank's outgoing boxes (one per rank of its node) and, once opened, each peer's box for it."""

    def __init__(self, ranks: int, index: int, name: str = "gearshift-bell") -> None:
        self.index = index
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(self.fd, ranks * BOX_BYTES)
        self.mm = mmap.mmap(self.fd, ranks * BOX_BYTES)
        self.out = [_Box(self.mm, i) for i in range(ranks)]
        self.inbox: dict[int, tuple[_Box, int, object]] = {}  # peer index -> (its box for me, pid, its mmap)
        self.seq = [0] * ranks  # calls with messages between this rank and each peer

    def open_peer(self, peer: int, pid: int, fd: int) -> None:
        """Map peer's memfd (its fd number in process pid, through /proc)."""
        own = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
        try:
            mm = mmap.mmap(own, os.fstat(own).st_size)
        finally:
            os.close(own)
        self.inbox[peer] = (_Box(mm, self.index), pid, mm)

    def next_call(self, peers) -> None:
        """Start a call that exchanges messages with these peers (indices): messages are matched to the
        call that sent them, counted per pair, so both ends count the same calls."""
        for p in peers:
            self.seq[p] += 1

    def _slot(self, peer: int, tag: int) -> tuple[int, int]:
        if not 0 <= tag < SLOTS:
            raise ValueError(f"doorbell tag {tag} outside [0, {SLOTS})")
        seq = self.seq[peer]
        return (seq & 1) * SLOTS + tag, ((seq & SEQ_MASK) + 1) << VALUE_BITS

    def send(self, peer: int, tag: int, value: int, timeout_s: float = TIMEOUT_S) -> None:
        """Put value in peer's box under tag and ring its bell (waits only if the slot still holds an unread
        message from two calls ago)."""
        if not 0 <= value < 1 << VALUE_BITS:
            raise ValueError(f"doorbell value {value} outside [0, 2**{VALUE_BITS})")
        box = self.out[peer]
        slot, stamp = self._slot(peer, tag)
        if box.slots[slot]:
            watch = _Watch(self.inbox[peer][1], timeout_s, f"peer {peer} to read tag {tag}")
            while box.slots[slot]:
                time.sleep(0.0005)
                watch.check()
        box.slots[slot] = stamp | value
        box.bell.value = (box.bell.value + 1) & 0x7FFFFFFF
        _futex(box.bell_addr, _FUTEX_WAKE, 1 << 30)

    def recv(self, peer: int, tag: int, timeout_s: float = TIMEOUT_S) -> int:
        """Wait for peer's message under tag in this call and take it (clears the slot)."""
        box, pid, _ = self.inbox[peer]
        slot, stamp = self._slot(peer, tag)
        want, watch, pause = stamp >> VALUE_BITS, None, _Timespec(0, int(POLL_S * 1e9))
        while True:
            v = box.slots[slot]
            if v >> VALUE_BITS == want:
                box.slots[slot] = 0
                return v & ((1 << VALUE_BITS) - 1)
            bell = box.bell.value
            if box.slots[slot] >> VALUE_BITS != want:
                _futex(box.bell_addr, _FUTEX_WAIT, bell, pause)
                watch = watch or _Watch(pid, timeout_s, f"tag {tag} from peer {peer} (pid {pid})")
                watch.check()

    def close(self) -> None:
        """Drop the mappings' exports and the memfd (the kernel frees it with its last mapping)."""
        self.out, self.inbox = [], {}
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Watch:
    """Raises, at most every POLL_S, once the peer process is gone or the timeout has passed."""

    def __init__(self, pid: int, timeout_s: float, what: str) -> None:
        self.pid, self.timeout_s, self.what = pid, timeout_s, what
        self.start = time.monotonic()
        self.next = self.start + POLL_S  # a wait that ends sooner checks nothing

    def check(self) -> None:
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + POLL_S
        if not process_alive(self.pid):
            raise RuntimeError(f"gearshift.comm: a rank of this node exited while waiting for {self.what}")
        if now - self.start > self.timeout_s:
            raise TimeoutError(f"gearshift.comm: waited {self.timeout_s:.0f} s for {self.what} (shared memory)")
