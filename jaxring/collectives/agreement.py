"""Before every cross-process collective: did every process arrive, asking for the same thing?

MPI collectives block until all processes join, and silently misbehave when
they pass different shapes. So each jaxring collective first exchanges a
16-byte digest of its arguments with a non-blocking allgather, polled against
a deadline: a process that never arrives turns into a TimeoutError, a
mismatch into a ValueError on every process naming the ranks and arguments.
"""

import hashlib
import time

import numpy as np

from jaxring.collectives import timeout as timeout_lib

_SPIN_S = 0.05


def agree(comm, what: str, descriptor: str, timeout: float | None = None) -> None:
    """Returns once every process of `comm` has called agree with an equal descriptor.

    Collective over `comm`. Raises TimeoutError if some process has not arrived
    within the timeout (the job should then abort: the late process would
    meet a different call), ValueError on every process if descriptors differ.
    `timeout`: seconds, inf for none, None for jaxring.collectives.timeout.default_timeout().
    """
    timeout = timeout_lib.resolve(timeout)
    digest = np.frombuffer(hashlib.blake2b(descriptor.encode(), digest_size=16).digest(), np.uint8)
    digests = np.empty((comm.Get_size(), digest.size), np.uint8)
    request = comm.Iallgather(digest, digests)
    _wait(request, time.monotonic() + timeout, comm, what, timeout)
    if (digests == digest).all():
        return
    # Every process holds the same digests, so every process gets here.
    by_descriptor = {}
    for rank, theirs in enumerate(comm.allgather(descriptor)):
        by_descriptor.setdefault(theirs, []).append(rank)
    listing = "; ".join(
        f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks))}: {theirs}"
        for theirs, ranks in by_descriptor.items()
    )
    raise ValueError(
        f"{what} was called with different arguments on different processes ({listing}). "
        "Every process must make the same collective calls with the same shapes and dtypes."
    )


def _wait(request, deadline: float, comm, what: str, timeout: float) -> None:
    # A non-blocking collective advances only while its processes call into MPI,
    # so poll without pause (yielding the core) while the others are likely close
    # behind, then every millisecond so that a long wait costs no CPU.
    start = time.monotonic()
    while not request.Test():
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(
                f"{what}: rank {comm.Get_rank()} of {comm.Get_size()} waited {timeout:g} s "
                "and not every process arrived. One of them skipped this call, died or is "
                f"stuck; the limit is set by timeout=, jaxring.set_default_timeout or ${timeout_lib.ENV}. The processes are "
                "now out of step: end the job (python -m mpi4py aborts it on an uncaught "
                "exception)."
            )
        time.sleep(0 if now - start < _SPIN_S else 1e-3)
