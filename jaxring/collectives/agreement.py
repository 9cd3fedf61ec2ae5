"""Before every cross-process collective: did every process arrive, asking for the same thing?

MPI collectives block until all processes join, and silently misbehave when
they pass different shapes. So each jaxring collective first exchanges a
16-byte digest of its arguments with a non-blocking allgather, polled against
a deadline: a process that never arrives turns into a TimeoutError, a
mismatch into a ValueError on every process naming the ranks and arguments.
A wait that expires (here or in the exchange that follows, jaxring/collectives/mpi.py)
ends in a roll call, so that the TimeoutError names the processes that did
not answer.
"""

import hashlib
import json
import time
from collections.abc import Mapping

import numpy as np

from jaxring.collectives import timeout as timeout_lib

_SPIN_S = 0.05
# A mismatch names at most this many differing entries: a whole model's listing buries the one that differs.
MAX_DIFFERENCES = 4
# The roll call after a timeout waits this long (at most the timeout itself) for
# the others, which meet their own deadlines at about the same moment.
ROLL_CALL_S = 5.0
_ROLL_CALL_TAG = 0x6A72  # point-to-point, so it never matches the collectives on the same communicator


def agree(comm, what: str, descriptor: str | Mapping[str, str], timeout: float | None = None) -> None:
    """Returns once every process of `comm` has called agree with an equal descriptor.

    Collective over `comm`. Raises TimeoutError if some process has not arrived
    within the timeout (the job should then abort: the late process would
    meet a different call), ValueError on every process if descriptors differ.
    A mapping (e.g. a tree's leaf paths to their dtypes and shapes) lets that
    error name only the entries that differ. `timeout`: seconds, inf for none,
    None for jaxring.collectives.timeout.default_timeout().
    """
    timeout = timeout_lib.resolve(timeout)
    text = descriptor if isinstance(descriptor, str) else json.dumps(dict(descriptor), sort_keys=True)
    digest = np.frombuffer(hashlib.blake2b(text.encode(), digest_size=16).digest(), np.uint8)
    digests = np.empty((comm.Get_size(), digest.size), np.uint8)
    request = comm.Iallgather(digest, digests)
    _wait(request, time.monotonic() + timeout, comm, what, timeout)
    if (digests == digest).all():
        return
    # Every process holds the same digests, so every process gets here.
    raise ValueError(
        f"{what} was called with different arguments on different processes: "
        f"{differences(comm.allgather(descriptor))}. "
        "Every process must make the same collective calls with the same shapes and dtypes."
    )


def differences(descriptors: list) -> str:
    """What differs between the ranks' descriptors (one per rank, in rank order): for mappings, the
    entries that differ, each with every rank's value, at most MAX_DIFFERENCES of them."""
    if not all(isinstance(d, Mapping) for d in descriptors):
        return _by_rank(descriptors)
    keys = dict.fromkeys(key for d in descriptors for key in d)
    lines = [f"{key} ({_by_rank([d.get(key, '(absent)') for d in descriptors])})" for key in keys
             if len({d.get(key, "(absent)") for d in descriptors}) > 1]
    more = len(lines) - MAX_DIFFERENCES
    return "; ".join(lines[:MAX_DIFFERENCES]) + (f"; and {more} more entries differ" if more > 0 else "")


def _by_rank(values: list) -> str:
    """'rank 0: a; ranks 1, 2: b': each distinct value once, after the ranks that hold it."""
    ranks_of = {}
    for rank, value in enumerate(values):
        ranks_of.setdefault(value, []).append(rank)
    return "; ".join(f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks))}: {value}"
                     for value, ranks in ranks_of.items())


def _wait(request, deadline: float, comm, what: str, timeout: float) -> None:
    # A non-blocking collective advances only while its processes call into MPI,
    # so poll without pause (yielding the core) while the others are likely close
    # behind, then every millisecond so that a long wait costs no CPU.
    start = time.monotonic()
    while not request.Test():
        now = time.monotonic()
        if now > deadline:
            raise timeout_error(comm, what, timeout)
        time.sleep(0 if now - start < _SPIN_S else 1e-3)


def timeout_error(comm, what: str, timeout: float) -> TimeoutError:
    """The TimeoutError of a wait on `comm` that expired, naming the processes a roll call did not reach."""
    missing = missing_ranks(comm, min(timeout, ROLL_CALL_S))
    who = (
        f"no answer from {_ranks(missing)}"
        if missing else "every process answered the roll call after it, so one of them is late rather than gone"
    )
    return TimeoutError(
        f"{what}: rank {comm.Get_rank()} of {comm.Get_size()} waited {timeout:g} s and not every "
        f"process arrived; {who} ({_in_world(comm, missing)}stopped, dead, or in another call). The limit is set by timeout=, "
        f"jaxring.set_default_timeout or ${timeout_lib.ENV}. The processes are now out of step: the "
        "job must end (scripts/train.py aborts it on an uncaught exception, as python -m mpi4py does)."
    )


def _ranks(ranks) -> str:
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks))}"


def _in_world(comm, ranks) -> str:
    """"rank W of MPI.COMM_WORLD; " for `ranks` of `comm` (a sub-communicator's) where their world ranks
    differ, else "": the launcher and the leg's messages (csrc/mpi/mpi_host_ring.cc) name world ranks too."""
    from mpi4py import MPI  # here, not at import: importing this module must not start MPI

    group, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
    in_world = MPI.Group.Translate_ranks(group, list(ranks), world)
    group.Free()
    world.Free()
    if list(in_world) == list(ranks) or MPI.UNDEFINED in in_world:
        return ""
    return f"{_ranks(in_world)} of MPI.COMM_WORLD; "


def missing_ranks(comm, grace: float) -> list[int]:
    """The other ranks of `comm` that do not answer within `grace` s, every rank calling this on a timeout."""
    rank, size = comm.Get_rank(), comm.Get_size()
    others = [r for r in range(size) if r != rank]
    token = np.array([rank], np.int32)
    for r in others:
        comm.Isend(token, dest=r, tag=_ROLL_CALL_TAG)  # one int: sent eagerly, never waited for
    answers = {r: comm.Irecv(np.empty(1, np.int32), source=r, tag=_ROLL_CALL_TAG) for r in others}
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and not all(request.Test() for request in answers.values()):
        time.sleep(1e-3)
    missing = [r for r, request in answers.items() if not request.Test()]
    for r in missing:
        answers[r].Cancel()  # no answer will come: MPI_Finalize must not wait for one
    return missing
