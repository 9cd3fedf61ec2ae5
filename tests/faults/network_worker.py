"""Run across an emulated cluster by the network fault tests: all-reduces in a loop, each checked.

    python tests/faults/network_worker.py ITERATIONS FLOATS [--sleep S]

Each process contributes normal(seed=rank*1000+i) and compares the result with
the float64 sum of every rank's contribution (tolerance for float32 sums);
it prints "iteration i ok" after each, "WRONG ..." if one differs (a silent
wrong result), and "done" at the end. A fault test cuts or kills a node
between the printed lines.
"""

import argparse
import time

import numpy as np

from jaxring.collectives import global_ops, topology
from jaxring.collectives.abort import abort_on_uncaught_exception

abort_on_uncaught_exception()  # what scripts/train.py does
parser = argparse.ArgumentParser()
parser.add_argument("iterations", type=int)
parser.add_argument("floats", type=int)
parser.add_argument("--sleep", type=float, default=0.0, help="seconds between all-reduces")
args = parser.parse_args()
world = topology.init()
devices = len(world.local_devices)


def contribution(rank, i):
    return np.random.default_rng(rank * 1000 + i).normal(size=(devices, args.floats))


for i in range(args.iterations):
    got = np.asarray(global_ops.global_allreduce(contribution(world.rank, i).astype(np.float32)))
    want = sum(contribution(r, i).sum(axis=0) for r in range(world.size))
    if not np.allclose(got, want[None], rtol=1e-4, atol=1e-4 * np.sqrt(world.size * devices)):
        print(f"WRONG rank {world.rank} iteration {i}: max error {np.abs(got - want).max()}", flush=True)
    print(f"rank {world.rank} iteration {i} ok", flush=True)
    time.sleep(args.sleep)
print(f"rank {world.rank} done", flush=True)
