"""Run by test_mpi.py under `mpirun -np P python -m mpi4py`, each rank seeing K host devices.

Every check either passes on every rank or raises, and `python -m mpi4py`
turns an uncaught exception into MPI_Abort, so the job never hangs. Each rank
prints "PASS <check>" per check; test_mpi.py counts them.
"""

import hashlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from mpi4py import MPI

from jaxring.collectives import mpi, replicas, topology

SEED = 20261121
SHAPES = [(0,), (1,), (3,), (7,), (129,), (5, 33)]  # empty, tiny, below the device counts, odd
DTYPES = [jnp.float32, jnp.bfloat16]

world = topology.init()
comm = MPI.COMM_WORLD
L = len(world.local_devices)


def passed(check):
    print(f"PASS rank {world.rank} {check}", flush=True)


def data(rank, case, shape, dtype):
    """Rank `rank`'s input for `case`: any rank can rebuild any other rank's data."""
    rng = np.random.default_rng([SEED, rank, case])
    return rng.standard_normal((L, *shape)).astype(dtype)


def reference(case, shape, dtype):
    """float64 sum over every device of every process, and the sum of magnitudes (for error bounds)."""
    inputs = [data(r, case, shape, dtype).astype(np.float64) for r in range(world.size)]
    return sum(x.sum(0) for x in inputs), sum(np.abs(x).sum(0) for x in inputs)


def same_everywhere(out):
    """Every row of every process holds the same bits."""
    rows = np.asarray(out)
    digest = hashlib.blake2b(rows[0].tobytes()).hexdigest()
    return all(row.tobytes() == rows[0].tobytes() for row in rows) and len(set(comm.allgather(digest))) == 1


def check_topology():
    assert world.rank == comm.Get_rank() and world.size == comm.Get_size()
    # mpirun started every rank on this one node.
    assert (world.local_rank, world.local_size) == (world.rank, world.size)
    assert world.local_devices == tuple(jax.local_devices())
    assert world.n_devices == world.size * L
    passed("topology")


def check_allreduce():
    case = 0
    for shape in SHAPES:
        for dtype in DTYPES:
            case += 1
            x = data(world.rank, case, shape, dtype)
            results = {alg: mpi.global_allreduce(x, algorithm=alg) for alg in ("ring", "mpi")}
            for alg, out in results.items():
                assert out.shape == x.shape and out.dtype == x.dtype, (alg, out.shape, out.dtype)
            if x.size == 0:
                continue
            want, magnitude = reference(case, shape, dtype)
            # Each rounding is at most eps/2 of a partial sum: float32 adds once per
            # term, 16-bit types round after the local and the cross-process sums.
            terms = world.n_devices if dtype == jnp.float32 else 2
            tolerance = terms * float(jnp.finfo(dtype).eps) * magnitude + 1e-30
            for alg, out in results.items():
                got = np.asarray(out).astype(np.float64)
                assert (np.abs(got - want) <= tolerance).all(), (alg, shape, dtype, np.abs(got - want).max())
                assert same_everywhere(out), (alg, shape, dtype)
            ring, mpi_ = (np.asarray(results[a]).astype(np.float64) for a in ("ring", "mpi"))
            assert (np.abs(ring - mpi_) <= 2 * tolerance).all(), (shape, dtype)
    passed("allreduce")


def check_mean_and_auto():
    shape, dtype = (2, 50), jnp.float32
    x = data(world.rank, 100, shape, dtype)
    want, magnitude = reference(100, shape, dtype)
    tolerance = world.n_devices * float(jnp.finfo(dtype).eps) * magnitude
    for alg in mpi.ALGORITHMS:
        mean = np.asarray(mpi.global_allreduce(x, op="mean", algorithm=alg)).astype(np.float64)
        assert (np.abs(mean - want / world.n_devices) <= tolerance / world.n_devices).all(), alg
    auto = mpi.global_allreduce(x, algorithm="auto")
    chosen = mpi.choose_algorithm(x[0].nbytes, world.size)
    assert np.array_equal(np.asarray(auto), np.asarray(mpi.global_allreduce(x, algorithm=chosen)))
    passed("mean_and_auto")


def int_data(rank, shape):
    return np.random.default_rng([SEED, rank, 300]).integers(-1000, 1000, (L, *shape)).astype(np.int32)


def check_int32_and_pytrees():
    shape = (3, 7)
    want = sum(int_data(r, shape).astype(np.int64).sum(0) for r in range(world.size))
    tree = {"ints": int_data(world.rank, shape), "floats": [data(world.rank, 400, (9,), jnp.float32)]}
    float_want, magnitude = reference(400, (9,), jnp.float32)
    for alg in ("ring", "mpi"):
        out = mpi.global_allreduce(tree, algorithm=alg)
        assert out["ints"].dtype == np.int32 and (np.asarray(out["ints"]) == want).all(), alg
        tolerance = world.n_devices * float(jnp.finfo(jnp.float32).eps) * magnitude
        assert (np.abs(np.asarray(out["floats"][0], np.float64) - float_want) <= tolerance).all(), alg
        mean = mpi.global_allreduce(tree["ints"], op="mean", algorithm=alg)
        # As lax.pmean: the mean of integers is a float.
        assert mean.dtype == np.float32, mean.dtype
        np.testing.assert_allclose(np.asarray(mean), np.broadcast_to(want / world.n_devices, mean.shape), rtol=1e-6)
    passed("int32_and_pytrees")


def check_mismatch():
    odd_one = world.size - 1
    length = 11 if world.rank == odd_one else 10
    try:
        mpi.global_allreduce(np.zeros((L, length), np.float32))
    except ValueError as error:
        message = str(error)
    else:
        raise AssertionError("mismatched shapes were not detected")
    assert f"rank {odd_one}: float32[{L}, 11]" in message, message
    assert f"float32[{L}, 10]" in message, message
    # The mismatch is found before any data moves, so the processes stay in step.
    out = mpi.global_allreduce(np.ones((L, 4), np.float32))
    assert (np.asarray(out) == world.n_devices).all()
    passed("mismatch")


def rank_tree(rank):
    rng = np.random.default_rng([SEED, rank, 200])
    stacked = np.repeat(rng.standard_normal((1, 5)).astype(jnp.bfloat16), L, axis=0)
    return {
        "dense": {"kernel": rng.standard_normal((3, 4)).astype(np.float32), "steps": np.int32(rank)},
        # One row per local device, laid out as pmap returns it.
        "stacked": jax.device_put(stacked, NamedSharding(Mesh(world.local_devices, ("d",)), P("d"))),
        "scalar": jax.device_put(np.float32(rank), world.local_devices[-1]),
    }


def check_broadcast_and_replicas():
    root = world.size - 1
    mine = rank_tree(world.rank)
    got = replicas.broadcast(mine, root=root)
    want = rank_tree(root)
    for path, leaf in jax.tree_util.tree_leaves_with_path(got):
        expected = dict(jax.tree_util.tree_leaves_with_path(want))[path]
        assert np.asarray(leaf).tobytes() == np.asarray(expected).tobytes(), path
    assert got["stacked"].sharding == mine["stacked"].sharding
    assert got["scalar"].sharding == mine["scalar"].sharding
    replicas.check_replicas(got)

    # One device row drifts on one process.
    drifting = world.size - 1
    if world.rank == drifting:
        rows = [s.data for s in got["stacked"].addressable_shards]
        rows[-1] = rows[-1] + jnp.bfloat16(1)
        got["stacked"] = jax.make_array_from_single_device_arrays(
            got["stacked"].shape, got["stacked"].sharding, rows
        )
    assert not replicas.replicas_consistent(got)
    try:
        replicas.check_replicas(got)
    except replicas.ReplicasDivergedError as error:
        message = str(error)
    else:
        raise AssertionError("divergent replicas were not reported")
    assert f"['stacked']: rank {drifting} device {world.local_devices[-1].id} differ" in message, message
    passed("broadcast_and_replicas")


def check_host_leaf_divergence():
    tree = {"w": np.arange(6, dtype=np.float32) + (world.rank == 0)}
    if world.size > 1:
        assert not replicas.replicas_consistent(tree)
    assert replicas.replicas_consistent({"w": np.arange(6, dtype=np.float32)})
    passed("host_leaf_divergence")


if __name__ == "__main__":
    for name in sys.argv[1:]:
        globals()[f"check_{name}"]()
