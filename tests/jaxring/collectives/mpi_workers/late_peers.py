"""Run by test_mpi.py under mpirun: processes that reach every all-reduce at different times.

Before each call of the program, rank 1 sleeps 50 ms, so the other processes'
legs wait far longer than a leg may wait on XLA's thread (cpu_mpi_ring.cc)
and a task thread takes them over at their first message. A second pass
gives the legs no patience at all: every wait that a message does not
answer at once hands the leg over, mid-ring too (the ring in 3-element
pieces has hundreds of stages). Each algorithm of the leg, a program of
three chained means, against float64 numpy, bitwise equal on every device
of every process; then the threads the legs finished on: with the default
patience the late process finds the others' one-shot messages waiting and
finishes those legs on XLA's thread while every other process hands legs
off; with none, every process hands legs off.
"""

import time

import jax
import numpy as np
from mpi4py import MPI

import jaxring
from jaxring.collectives import _jaxring_mpi, mpi, topology

LATE_RANK = 1
CALLS = 4

world = topology.init()
comm = MPI.COMM_WORLD
rng = np.random.default_rng(world.rank)
settings = {"one-shot": (1 << 40, mpi.PIECE_BYTES), "ring whole": (0, 1 << 40), "ring pieces": (0, 12)}


def three_means(x):
    for _ in range(3):
        x = jaxring.allreduce(x, "d", op="mean", processes=True)
    return x


for patience_us in (_jaxring_mpi.DEFAULT_LEG_PATIENCE_US, 0):
    _jaxring_mpi.set_leg_patience_us(patience_us)
    before = _jaxring_mpi.leg_threads()
    for name, (mpi.ONE_SHOT_MAX_BYTES, mpi.PIECE_BYTES) in settings.items():
        x = rng.standard_normal((len(world.local_devices), 1001)).astype(np.float32)
        expected = np.concatenate(comm.allgather(x)).astype(np.float64).mean(0)
        # a function of its own: JAX would reuse the lowering of an earlier setting for the same one
        program = jax.pmap(lambda v: three_means(v), "d", devices=world.local_devices)
        for call in range(CALLS):
            if world.rank == LATE_RANK:
                time.sleep(0.05)
            out = np.asarray(program(x))
            where = f"{name}, patience {patience_us} us, call {call}"
            np.testing.assert_allclose(out, np.broadcast_to(expected, out.shape), rtol=1e-5, atol=1e-6, err_msg=where)
            assert len(set(comm.allgather(out.tobytes()))) == 1, f"{where}: processes differ"
            assert len({device.tobytes() for device in out}) == 1, f"{where}: devices differ"
    threads = {key: count - before[key] for key, count in _jaxring_mpi.leg_threads().items()}
    if patience_us == 0 or world.rank != LATE_RANK:
        assert threads["handed_off"] > 0, (patience_us, threads)
    else:
        assert threads["finished_on_xla_thread"] > 0, (patience_us, threads)
    print(f"rank {world.rank} patience {patience_us} us, legs {threads}", flush=True)
_jaxring_mpi.set_leg_patience_us(_jaxring_mpi.DEFAULT_LEG_PATIENCE_US)
print(f"PASS rank {world.rank} late_peers", flush=True)
