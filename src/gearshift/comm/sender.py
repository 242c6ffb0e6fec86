"""Gloo sends issued from a background thread.

gloo writes a send into its socket on the calling thread, as far as the socket takes it: on loopback
or a fast link that is most of the message. A rank that sends and reduces on one thread therefore
copies every byte it sends before it can add what it received. Large sends go through this thread
instead, so with a core to spare one thread sends while the other reduces (the leader of the
hierarchical all-reduce sends 1.5 S and adds 2 S). One thread: sends keep the order they were posted in.
"""

from __future__ import annotations

import queue
import threading

import torch
import torch.distributed as dist

MIN_BYTES = 256 << 10  # smaller sends go out at once: a thread hop costs more than their copy


class Sending:
    """A send handed to the sender thread: wait() returns once the send itself has finished (or raises
    what posting it raised)."""

    __slots__ = ("args", "work", "error", "issued")

    def __init__(self, tensor: torch.Tensor, dst: int, group, tag: int) -> None:
        self.args = (tensor, dst, group, tag)
        self.work = None
        self.error: BaseException | None = None
        self.issued = threading.Event()

    def wait(self) -> None:
        self.issued.wait()
        if self.error is not None:
            raise self.error
        self.work.wait()


class Sender:
    """One rank's sender thread (started on the first large send), owned by its CommGroups: no module state.
    min_bytes: smaller sends go out from the caller's thread."""

    def __init__(self, min_bytes: int = MIN_BYTES) -> None:
        self.min_bytes = min_bytes
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def isend(self, tensor: torch.Tensor, dst: int, group=None, tag: int = 0):
        """dist.isend, from the sender thread when the message is large; returns something with wait()."""
        if tensor.numel() * tensor.element_size() < self.min_bytes:
            return dist.isend(tensor, dst, group=group, tag=tag)
        self._start()
        s = Sending(tensor, dst, group, tag)
        self._queue.put(s)
        return s

    def _start(self) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._serve, name="gearshift-sender", daemon=True)
                    self._thread.start()

    def _serve(self) -> None:
        while True:
            s = self._queue.get()
            tensor, dst, group, tag = s.args
            try:
                s.work = dist.isend(tensor, dst, group=group, tag=tag)
            except BaseException as exc:  # raised to the rank's own thread by wait()
                s.error = exc
            s.issued.set()
