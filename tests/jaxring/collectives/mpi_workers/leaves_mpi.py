"""Run by test_mpi.py under mpirun: after each program, the processes wait for each other outside MPI.

As when the next collective is another transport's (JAX's gloo psum): each
process says through a file in the directory given as the first argument
that its program finished, then waits, making no MPI call, until every
other process has said so. A leg whose receives completed may still owe its
peer the answer that completes the peer's send (Open MPI sends it at the
receiver's next MPI call); the legs' farewells (csrc/mpi/mpi_host_ring.cc) keep
each process calling MPI until every send to it completed, so no process
is left waiting for one that has gone. Then: elements per device, programs.
"""

import pathlib
import sys
import time

import jax
import numpy as np
from mpi4py import MPI

import jaxring
from jaxring.collectives import topology

PROGRAMS = int(sys.argv[3]) if len(sys.argv) > 3 else 12
WAIT_S = 30.0

world = topology.init()
signals, elements = pathlib.Path(sys.argv[1]), int(sys.argv[2])
inputs = [np.random.default_rng(r).standard_normal((1, elements)).astype(np.float32) for r in range(world.size)]
assert len(world.local_devices) == 1, "one device per process"
x = inputs[world.rank]
expected = np.sum(inputs, axis=0, dtype=np.float64)


def three_sums(v):
    v = jaxring.allreduce(v, "d", processes=True)
    n = world.size
    return jaxring.allreduce(jaxring.allreduce(v / n, "d", processes=True) / n, "d", processes=True)


program = jax.pmap(three_sums, "d", devices=world.local_devices)
MPI.COMM_WORLD.Barrier()
for i in range(PROGRAMS):
    out = np.asarray(program(x))
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4, err_msg=f"program {i}")
    (signals / f"rank{world.rank}-program{i}").touch()
    deadline = time.monotonic() + WAIT_S
    for rank in range(world.size):
        while not (signals / f"rank{rank}-program{i}").exists():
            assert time.monotonic() < deadline, f"rank {rank} did not finish program {i} within {WAIT_S} s"
            time.sleep(0.0005)
print(f"PASS rank {world.rank} leaves_mpi", flush=True)
