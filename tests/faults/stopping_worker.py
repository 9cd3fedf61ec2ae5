"""Run under mpirun by test_stuck_rank.py: rank 1 stops itself before its second all-reduce.

Arguments: the signal (default STOP) and where the others wait: in the
leg's one-shot algorithm (the default for this buffer), its "ring", or a
"barrier" of mpi4py (the others then never enter the leg).

The agreement ran once, when the first call compiled; the other ranks wait
in the exchange itself (the MPI leg of the compiled program); they must time
out naming rank 1 (stopped), or be told by MPI that it failed (killed), and
the job must end.
"""

import os
import signal
import sys

import numpy as np

from jaxring.collectives import global_ops, mpi, topology
from jaxring.collectives.abort import abort_on_uncaught_exception

abort_on_uncaught_exception()  # what scripts/train.py does
signal_name = sys.argv[1] if len(sys.argv) > 1 else "STOP"
algorithm = sys.argv[2] if len(sys.argv) > 2 else "one-shot"
if algorithm == "ring":
    mpi.ONE_SHOT_MAX_BYTES = 0
world = topology.init()
x = np.random.default_rng(world.rank).normal(size=(len(world.local_devices), 1001)).astype(np.float32)
global_ops.global_allreduce(x)  # compiled and run once: the stop below is in the middle of a job
if world.rank == 1:
    # the others are already in the compiled exchange, or about to be
    os.kill(os.getpid(), getattr(signal, "SIG" + signal_name))
if algorithm == "barrier":
    from mpi4py import MPI

    MPI.COMM_WORLD.Barrier()
global_ops.global_allreduce(x).block_until_ready()  # dispatched asynchronously: its error comes with the result
print(f"FAIL rank {world.rank}: global_allreduce returned although rank 1 stopped in it", flush=True)
