"""Run by test_agreement.py under mpirun, 2 processes: broadcast and check_replicas of trees that differ in one leaf.

A model of 40 leaves where rank 1's 'layer_7' bias has another shape: each
process prints the error it gets, which must name that leaf only.
"""

import numpy as np
from mpi4py import MPI

from jaxring.collectives import replicas

rank = MPI.COMM_WORLD.Get_rank()
model = {f"layer_{i}": {"kernel": np.ones((4, 4), np.float32), "bias": np.ones(4, np.float32)} for i in range(20)}
model["layer_7"]["bias"] = np.ones(4 + rank, np.float32)
for call in (replicas.broadcast, replicas.check_replicas):
    try:
        call(model, timeout=60)
    except ValueError as e:
        print(f"rank {rank} {call.__name__}: {e}", flush=True)
