"""A bound on how long a queued step may take, for collectives that have none of their own (mpi4jax's).

jaxring's collectives give up after the collectives' timeout
(jaxring/collectives/timeout.py) and end the job. mpi4jax's allreduce waits in
MPI for as long as a stopped peer takes, and the steps queue, so the host only
ever waits in a later `block_until_ready`. The watchdog watches each step's
output from a thread of its own: when the oldest unfinished step has made no
progress for the timeout (since it was queued, or since the step before it
finished, whichever is later), it names what happened and ends the job.
"""

from __future__ import annotations

import collections
import math
import threading
import time

from jaxring.collectives import abort, timeout as timeout_lib


class StepWatchdog:
    """Ends the job when a watched step has not finished `timeout_s` after it could have started."""

    def __init__(self, rank: int, why: str, timeout_s: float | None = None, end=abort.exit_job):
        # why: the words that say why this run's steps can wait forever; end(message): abort.exit_job's
        # (print it, MPI_Abort); the tests pass their own.
        self.rank, self.why, self.end = rank, why, end
        self.timeout_s = timeout_lib.default_timeout() if timeout_s is None else timeout_lib.check(timeout_s)
        self._pending: collections.deque = collections.deque()  # (seconds when queued, output array)
        self._lock = threading.Lock()
        self._thread = None

    def watch(self, output) -> None:
        """Watch a step whose `output` (a jax.Array it computes, not donated later) is ready when it is done."""
        if math.isinf(self.timeout_s):
            return
        with self._lock:
            self._pending.append((time.monotonic(), output))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="jaxring-step-watchdog", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        poll_s = min(1.0, self.timeout_s / 10)
        last_done = time.monotonic()
        while True:
            time.sleep(poll_s)
            with self._lock:
                while self._pending and self._pending[0][1].is_ready():
                    self._pending.popleft()
                    last_done = time.monotonic()
                oldest = self._pending[0][0] if self._pending else None
            if oldest is not None and time.monotonic() - max(oldest, last_done) > self.timeout_s:
                self.end(f"rank {self.rank}: a training step has not finished in {self.timeout_s:g} s "
                         f"({timeout_lib.ENV}): {self.why}. A process of the job stopped or is stuck; ending the job.")
                return
