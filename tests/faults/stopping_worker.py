"""Run under mpirun by test_stuck_rank.py: rank 1 stops itself (SIGSTOP) as the exchange across processes begins.

The other ranks have passed the agreement before the exchange and wait in the
exchange itself; they must time out naming rank 1, and the job must end.
"""

import os
import signal

import numpy as np

from jaxring.collectives import mpi, topology
from jaxring.collectives.abort import abort_on_uncaught_exception

abort_on_uncaught_exception()  # what scripts/train.py does
world = topology.init()
x = np.random.default_rng(world.rank).normal(size=(len(world.local_devices), 1001)).astype(np.float32)
mpi.global_allreduce(x)  # one that completes: the stop below is in the middle of a job
if world.rank == 1:
    exchange = mpi._exchange

    def stop_then_exchange(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGSTOP)
        return exchange(*args, **kwargs)

    mpi._exchange = stop_then_exchange
mpi.global_allreduce(x)
print(f"FAIL rank {world.rank}: global_allreduce returned although rank 1 stopped in it", flush=True)
