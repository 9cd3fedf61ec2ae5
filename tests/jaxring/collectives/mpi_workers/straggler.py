"""Run by test_mpi.py under mpirun: rank 1 stops calling global_allreduce; the others must time out naming a rank.

The timeout comes from $JAXRING_TIMEOUT_S, set by the test. Every process
first runs both algorithms of the leg once (compiled, so the agreement at
lowering has passed); then rank 1 stays away and the legs themselves time
out. A one-shot leg (small buffers) waits on every other process, so each
waiting process names rank 1. The ring waits on its left neighbour: rank 2
(whose left is rank 1) names rank 1, and rank 0 names rank 2, which is itself
stuck waiting.
"""

import numpy as np

from jaxring.collectives import global_ops, mpi, topology

world = topology.init()
SMALL = np.ones((len(world.local_devices), 8), np.float32)
RING = np.ones((len(world.local_devices), (mpi.ONE_SHOT_MAX_BYTES // 4 + 1) * len(world.local_devices)), np.float32)


def expect_timeout(x, silent):
    try:
        global_ops.global_allreduce(x)
    except Exception as error:  # noqa: BLE001  (XLA reports a handler's failure as a ValueError "INTERNAL: ...")
        assert f"rank {world.rank} of {world.size} waited" in str(error), error
        assert f"no answer from rank {silent} (stopped, dead, or in another call)" in str(error), error
    else:
        raise AssertionError("global_allreduce returned although rank 1 never called it")


for x in (SMALL, RING):
    assert (np.asarray(global_ops.global_allreduce(x)) == world.n_devices).all()
if world.rank != 1:
    expect_timeout(SMALL, silent=1)
    expect_timeout(RING, silent=(world.rank - 1) % world.size)
    print(f"PASS rank {world.rank} straggler", flush=True)
