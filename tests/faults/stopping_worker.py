"""Run under mpirun by test_stuck_rank.py: rank 1 stops itself (SIGSTOP) before its second all-reduce.

The agreement ran once, when the first call compiled; the other ranks wait
in the exchange itself (the MPI leg of the compiled program); they must time out naming rank 1, and the job must end.
"""

import os
import signal

import numpy as np

from jaxring.collectives import mpi, topology
from jaxring.collectives.abort import abort_on_uncaught_exception

abort_on_uncaught_exception()  # what scripts/train.py does
world = topology.init()
x = np.random.default_rng(world.rank).normal(size=(len(world.local_devices), 1001)).astype(np.float32)
mpi.global_allreduce(x)  # compiled and run once: the stop below is in the middle of a job
if world.rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)  # the others are already in the compiled exchange, or about to be
mpi.global_allreduce(x).block_until_ready()  # dispatched asynchronously: its error comes with the result
print(f"FAIL rank {world.rank}: global_allreduce returned although rank 1 stopped in it", flush=True)
