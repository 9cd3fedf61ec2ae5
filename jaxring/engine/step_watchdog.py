"""A bound on how long a queued step may take, for collectives that have none of their own (mpi4jax's).

jaxring's collectives give up after the collectives' timeout
(jaxring/collectives/timeout.py) and end the job. mpi4jax's allreduce waits in
MPI for as long as a stopped peer takes, and the steps queue, so the host
waits in a later `block_until_ready`, or in a dispatch. The watchdog watches
each step from a thread of its own, from the call that queues it until its
loss is ready: when the oldest unfinished step has made no progress for the
timeout (since it was called, or since the step before it finished, whichever
is later), it names what happened and ends the job. The first step is
watched from when its call returns: JAX compiles the step's programs in that
call, which takes each process its own time.
"""

from __future__ import annotations

import atexit
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
        self._pending: collections.deque = collections.deque()  # [seconds when called, loss or None]
        self._lock = threading.Lock()
        self._thread = None
        self._stopped = threading.Event()

    def step(self, dispatch):
        """dispatch()'s result, a step's (state, metrics), watched from the call on (a dispatch that waits
        is watched too; the first step from its return) until metrics["loss"] is ready."""
        if math.isinf(self.timeout_s):
            return dispatch()
        if self._thread is None:  # the first step: it compiles
            state, metrics = dispatch()
            with self._lock:
                self._pending.append([time.monotonic(), metrics["loss"]])
                self._thread = threading.Thread(target=self._run, name="jaxring-step-watchdog", daemon=True)
                self._thread.start()
                # Python ends a daemon thread still running at exit inside whatever it calls; inside jaxlib's
                # is_ready that aborts the process (exit status 134 after a finished run). atexit runs first.
                atexit.register(self.stop)
            return state, metrics
        entry = [time.monotonic(), None]  # (seconds when called, the step's loss once dispatched)
        with self._lock:
            self._pending.append(entry)
        state, metrics = dispatch()
        entry[1] = metrics["loss"]
        return state, metrics

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stops watching and waits, at most `timeout_s`, for the thread to finish its poll (a poll that hangs
        must not hold up the exit)."""
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        poll_s = min(1.0, self.timeout_s / 10)
        last_done = time.monotonic()
        while not self._stopped.wait(poll_s):
            with self._lock:
                while self._pending and _done(self._pending[0][1]):
                    self._pending.popleft()
                    last_done = time.monotonic()
                oldest = self._pending[0][0] if self._pending else None
            if oldest is not None and time.monotonic() - max(oldest, last_done) > self.timeout_s:
                self.end(f"rank {self.rank}: a training step has not finished in {self.timeout_s:g} s "
                         f"({timeout_lib.ENV}): {self.why}. A process of the job stopped or is stuck; ending the job.")
                return


def _done(loss) -> bool:
    try:
        return loss is not None and loss.is_ready()
    except RuntimeError:  # deleted by its owner: nothing left to wait for
        return True
