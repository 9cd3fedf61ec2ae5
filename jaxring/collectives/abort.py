"""Ending the whole MPI job when one of its processes fails.

A process that stops on an exception (a TimeoutError naming a stuck peer, a
bad input, a bug) while the others wait for it in a collective leaves them
waiting, and cannot exit itself: MPI_Finalize waits for them too. `python -m
mpi4py script.py` aborts the job on an uncaught exception;
`abort_on_uncaught_exception` gives a script started as `python script.py`
under mpirun the same behaviour.
"""

import sys

from mpi4py import MPI


def abort_on_uncaught_exception() -> None:
    """After the usual traceback, an uncaught exception aborts every process of the job (if there are several)."""
    if MPI.COMM_WORLD.Get_size() == 1:
        return
    report = sys.excepthook

    def abort(kind, value, traceback):
        report(kind, value, traceback)
        sys.stdout.flush()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)

    sys.excepthook = abort


def exit_job(message: str) -> None:
    """Ends this process with `message` on stderr and exit status 1, and the whole job if it has several."""
    if MPI.COMM_WORLD.Get_size() > 1:
        print(message, file=sys.stderr, flush=True)
        sys.stdout.flush()
        MPI.COMM_WORLD.Abort(1)
    sys.exit(message)
