"""Run by test_mpi.py under mpirun: rank 1 never calls global_allreduce; the others must time out naming it.

The timeout comes from $JAXRING_TIMEOUT_S, set by the test.
"""

import numpy as np

from jaxring.collectives import mpi, topology

world = topology.init()
if world.rank != 1:
    try:
        mpi.global_allreduce(np.ones((len(world.local_devices), 8), np.float32))
    except TimeoutError as error:
        assert f"rank {world.rank} of {world.size} waited" in str(error), error
        assert "no answer from rank 1 (stopped, dead, or in another call)" in str(error), error
        print(f"PASS rank {world.rank} straggler", flush=True)
    else:
        raise AssertionError("global_allreduce returned although rank 1 never called it")
