"""Graceful stop: SIGTERM (what schedulers send) or SIGINT asks the job to stop at the next step boundary
with a checkpoint; a second signal stops it at once. Every rank learns of a request from the stop agreement
every rank enters after each step (runtime.agree.AnyRank), so all ranks stop after the same step."""

from __future__ import annotations

import signal


class StopRequest:
    """Installs the handlers on construction (main thread only); `signal_name` is set once asked to stop."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame) -> None:
        if self.signal_name is not None:  # asked twice: stop now
            raise SystemExit(128 + signum)
        self.signal_name = signal.Signals(signum).name

    @property
    def requested(self) -> bool:
        return self.signal_name is not None
