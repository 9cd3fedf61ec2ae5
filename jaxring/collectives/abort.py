"""Ending the whole MPI job when one of its processes fails or never starts.

A process that stops on an exception (a TimeoutError naming a stuck peer, a
bad input, a bug) while the others wait for it in a collective leaves them
waiting, and cannot exit itself: MPI_Finalize waits for them too. `python -m
mpi4py script.py` aborts the job on an uncaught exception;
`abort_on_uncaught_exception` gives a script started as `python script.py`
under mpirun the same behaviour; topology.initialize_jax_distributed installs
it, as under jax.distributed even mpi4py's abort comes too late (at exit,
after JAX's shutdown barrier has waited for the peers). MPI_Init itself waits for every process of
the job, with no limit: `start_mpi` bounds that wait.

Under Open MPI's fault tolerance (`mpirun --with-ft ulfm`) a process that
dies is reported to the others as an MPI error naming it; the job then ends
by exits, not by MPI_Abort (see `end_job`).
"""

import math
import os
import signal
import sys

from jaxring.collectives import timeout as timeout_lib

# Processes reach MPI_Init seconds apart (imports, a loaded machine), so its wait
# is bounded by the collectives' timeout but never by less than this.
MPI_INIT_MIN_S = 60.0


def start_mpi() -> None:
    """Initialises MPI, or ends this process (and so the job) if a process of the job never arrives.

    MPI_Init holds the interpreter until it returns, so the limit is SIGALRM's
    default action, which ends the process ("Alarm clock"; mpirun then ends the
    others). Call it from the main thread, before anything imports mpi4py.
    """
    seconds = max(timeout_lib.default_timeout(), MPI_INIT_MIN_S)
    if math.isinf(seconds):
        from mpi4py import MPI  # noqa: F401  (MPI_Init)

        return
    previous = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(math.ceil(seconds))
    from mpi4py import MPI  # noqa: F401,F811  (MPI_Init)

    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def abort_on_uncaught_exception() -> None:
    """After the usual traceback, an uncaught exception aborts every process of the job (if there are several)."""
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() == 1 or getattr(sys.excepthook, "ends_the_job", False):
        return
    report = sys.excepthook

    def abort(kind, value, traceback):
        report(kind, value, traceback)
        if failure := process_failure(value):
            print(failure, file=sys.stderr)
        end_job()

    abort.ends_the_job = True  # installed once, however often it is called
    sys.excepthook = abort


def process_failure(error: BaseException) -> str | None:
    """The line naming the failed processes, if `error` is MPI's report of a process failure; else None.

    MPI reports one where the job runs on after a process or node dies (Open
    MPI launched with `mpirun --with-ft ulfm`), to every process that then
    talks to it; mpi4py raises it as MPI.Exception.
    """
    from mpi4py import MPI

    proc_failed = getattr(MPI, "ERR_PROC_FAILED", None)
    if proc_failed is None or not isinstance(error, MPI.Exception) or error.Get_error_class() != proc_failed:
        return None
    named = ", ".join(f"rank {r}" for r in failed_ranks()) or "unknown processes"
    return (f"rank {MPI.COMM_WORLD.Get_rank()}: MPI reports a process failure; failed: {named} (the process, or its node, "
            "is gone). The job must end; a training job continues from its newest checkpoint with --resume "
            "once every node is back.")


def failed_ranks() -> list[int]:
    """The ranks of COMM_WORLD that MPI has reported failed to this process ([] where it reports none)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    try:
        failed = world.Get_failed()
    except (NotImplementedError, MPI.Exception):  # an MPI without the fault-tolerance extension
        return []
    ranks = MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())), world.Get_group())
    failed.Free()
    return sorted(ranks)


def end_job(status: int = 1) -> None:
    """Ends this process with `status` and, through MPI, the job.

    MPI_Abort, unless MPI has reported failed processes: then an exit. Under
    Open MPI's fault tolerance the others learn of the exit as one more failed
    process and end too, while an MPI_Abort from the last process standing
    made mpirun report success (exit status 0, Open MPI 5.0.11, 2 processes;
    tests/faults/test_stuck_rank.py).
    """
    from mpi4py import MPI

    sys.stdout.flush()
    sys.stderr.flush()
    if failed_ranks():
        os._exit(status)
    MPI.COMM_WORLD.Abort(status)


def exit_job(message: str) -> None:
    """Ends this process with `message` on stderr and exit status 1, and the whole job if it has several."""
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() > 1:
        print(message, file=sys.stderr, flush=True)
        end_job()
    sys.exit(message)
