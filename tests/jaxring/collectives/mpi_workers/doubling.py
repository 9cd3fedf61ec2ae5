"""Run by test_mpi.py under `mpirun -np 4 python -m mpi4py`, one device per process: the MPI leg's
recursive doubling (mpi.py's DOUBLING_MAX_BYTES: small buffers over 4 processes; one or several
messages each way) against float64 numpy, then a process that stays away.

Each check passes on every rank or raises (python -m mpi4py then aborts the job). Inputs differ per
rank and call; any rank rebuilds any other's. Last, rank 3 never calls: every other rank's leg must
time out (after timeout=2 s) naming the rank it waited on, as the ring's legs do.
"""

import hashlib
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from mpi4py import MPI

import jaxring
from jaxring.collectives import mpi, topology

sys.path.insert(0, str(pathlib.Path(__file__).parents[4]))  # the repository root, for tests.*
from tests.jaxring.collectives.leg_plans import plans_registered_by  # noqa: E402

ALGORITHMS = mpi._leg_module().ALGORITHMS

jax.config.update("jax_enable_x64", True)
world = topology.init()
comm = MPI.COMM_WORLD
SEED = 20261203
ABSENT = 3


def data(rank, case, shape, dtype):
    rng = np.random.default_rng([SEED, rank, case])
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-100 if np.issubdtype(dtype, np.signedinteger) else 0, 100, shape).astype(dtype)
    if np.issubdtype(dtype, np.complexfloating):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def same_everywhere(out):
    digest = hashlib.blake2b(np.asarray(out).tobytes()).hexdigest()
    return len(set(comm.allgather(digest))) == 1


def check(case, shape, dtype, op):
    x = data(world.rank, case, shape, dtype)
    reduce = jax.jit(lambda v: jaxring.allreduce(v, (), op, processes=True))
    (plan,) = plans_registered_by(lambda: reduce.lower(x))
    assert plan["algorithm"] == ALGORITHMS["recursive doubling"], (dtype, shape, "not lowered to recursive doubling")
    got = np.asarray(reduce(x))
    inputs = np.stack([data(r, case, shape, dtype) for r in range(world.size)])
    assert same_everywhere(got), (case, dtype, op)
    if op == "sum" and np.issubdtype(dtype, np.inexact):
        tolerance = world.size * np.finfo(dtype).eps * np.abs(inputs).sum(0)
        assert (np.abs(got - inputs.astype(np.complex128).sum(0)) <= tolerance).all(), (case, dtype)
    else:  # integers wrap as lax's do; max and min pick one of the terms
        want = {"sum": np.sum, "max": np.max, "min": np.min}[op](inputs, axis=0).astype(dtype)
        assert got.tobytes() == want.tobytes(), (case, dtype, op, got, want)


case = 0
for dtype in (np.float64, np.float32, np.complex64, np.int32, np.uint8):
    for shape in ((), (5,)):
        for op in ("sum",) if np.issubdtype(dtype, np.complexfloating) else ("sum", "max", "min"):
            check(case, shape, dtype, op)
            case += 1
# Several pieces (csrc/mpi/mpi_host_ring.cc's kEagerPieceBytes) each way, the last one shorter.
for dtype, shape, op in ((np.float64, (1001,), "sum"), (np.complex64, (3, 401), "sum"), (np.int32, (2001,), "max")):
    check(case, shape, dtype, op)
    case += 1
print(f"PASS rank {world.rank} doubling", flush=True)

late = np.ones(2)
assert (np.asarray(jaxring.allreduce(late, (), processes=True, timeout=2)) == world.size).all()  # compiled: agreed
if world.rank != ABSENT:
    try:
        jaxring.allreduce(late, (), processes=True, timeout=2)
    except Exception as error:  # noqa: BLE001  (XLA reports a handler's failure as a ValueError "INTERNAL: ...")
        # Ranks 2 and 1 wait on the absent rank (first and second exchange); rank 0 on rank 2, stuck.
        silent = ABSENT if ABSENT in (world.rank ^ 1, world.rank ^ 2) else world.rank ^ 2
        assert f"rank {world.rank} of {world.size} waited" in str(error), error
        assert f"no answer from rank {silent} (stopped, dead, or in another call)" in str(error), error
    else:
        raise AssertionError(f"the leg returned although rank {ABSENT} never called it")
    print(f"PASS rank {world.rank} doubling_timeout", flush=True)
