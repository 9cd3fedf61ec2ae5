"""Run by tests/jaxring/test_mpi4jax.py under `mpirun -np P python -m mpi4py`, one host device per rank.

members_alone (4 processes): ranks 1 and 3 reduce over their communicator while ranks 0 and 2
wait for them in a receive, calling nothing of jaxring's: the members must not wait on them. Then
rank 1 reduces without rank 3: its timeouts name rank 3 by its rank in both communicators.
drop_in (2 processes): jaxring.mpi4jax against mpi4jax itself in the same program and float64
numpy. As the other workers: every check passes on every rank or raises (and `python -m mpi4py`
aborts the job); each rank prints "PASS rank <rank> <check>". 64-bit types are on here.
"""

import sys
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import mpi4jax  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import jaxring  # noqa: E402
import jaxring.mpi4jax as drop_in  # noqa: E402

SEED = 20261203
WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()


def passed(check):
    print(f"PASS rank {RANK} {check}", flush=True)


def data(case, shape=(3, 7), dtype=np.float64, rank=RANK):
    rng = np.random.default_rng([SEED, rank, case])
    x = rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)
    if np.issubdtype(dtype, np.complexfloating):
        x = x + 1j * rng.standard_normal(shape)
    if np.issubdtype(dtype, np.integer):
        x = rng.integers(-1000, 1000, shape)
    return x.astype(dtype)


def check_members_alone():
    members = (1, 3)
    sub = WORLD.Split(0 if RANK in members else MPI.UNDEFINED, RANK)
    if RANK in members:
        x = data(1)
        want = np.sum(sub.allgather(x), axis=0)
        in_jit = jax.jit(lambda v: jaxring.allreduce(v, (), processes=sub))(x)
        eager = jaxring.allreduce(x, (), processes=sub)
        batched = jax.vmap(lambda v: jaxring.allreduce(v, (), "max", processes=sub))(x)
        np.testing.assert_allclose(np.asarray(in_jit), want, rtol=1e-15)
        np.testing.assert_array_equal(np.asarray(eager), np.asarray(in_jit))
        np.testing.assert_array_equal(np.asarray(batched), np.max(sub.allgather(x), axis=0))
        np.testing.assert_allclose(np.asarray(drop_in.allreduce(x, MPI.SUM, comm=sub)), want, rtol=1e-15)
        within_1s = jax.jit(lambda v: jaxring.allreduce(v, (), processes=sub, timeout=1))
        within_1s(x)  # compiled and agreed by both
        if RANK == 1:  # rank 3, the communicator's rank 1, comes no more: named by both its ranks
            # The compiled leg's wait (csrc/mpi/mpi_host_ring.cc), then an agreement's (agreement.py).
            waits = {"waited 1 s for a": lambda: within_1s(data(2)),
                     "waited 1 s and not every": lambda: jaxring.allreduce(data(3), (), processes=sub, timeout=1)}
            for waited, alone in waits.items():
                try:
                    jax.block_until_ready(alone())
                except Exception as error:  # noqa: BLE001 - XLA's runtime error or a TimeoutError
                    assert waited in str(error), error
                    assert "no answer from rank 1 (rank 3 of MPI.COMM_WORLD; stopped" in str(error), error
                else:
                    raise AssertionError("rank 1's leg over its communicator without rank 3 did not time out")
        for other in set(range(SIZE)) - set(members):
            WORLD.send("done", dest=other, tag=61)
    else:
        for member in members:
            assert WORLD.recv(source=member, tag=61) == "done"
    # The whole job joins afterwards, the members' communicator already set up without it.
    total = jax.jit(lambda v: jaxring.allreduce(v, (), processes=True))(np.float64(RANK + 0.5))
    assert float(total) == sum(r + 0.5 for r in range(SIZE)), float(total)
    passed("members_alone")


def both(call, x):
    """call(jaxring.mpi4jax, x) and call(mpi4jax, x), each in a jit program of its own: in one program
    nothing orders the two libraries' collectives, so two processes could each wait in a different one."""
    return jax.jit(lambda v: call(drop_in, v))(x), jax.jit(lambda v: call(mpi4jax, v))(x)


def check_drop_in():
    dtypes = [np.float64, np.float32, np.complex128, np.int32]
    for case, dtype in enumerate(dtypes):
        x = data(10 + case, dtype=dtype)
        rows = np.stack(WORLD.allgather(x))
        ops = [(MPI.SUM, rows.sum(0))]
        if not np.issubdtype(dtype, np.complexfloating):
            ops += [(MPI.MAX, rows.max(0)), (MPI.MIN, rows.min(0))]
        for op, want in ops:
            ours, theirs = both(lambda library, v: library.allreduce(v, op), x)
            assert ours.dtype == theirs.dtype == x.dtype and ours.shape == x.shape, (ours.dtype, theirs.dtype)
            # Two processes: a sum of two, rounded once, in either library.
            np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs), err_msg=f"{dtype} {op}")
            np.testing.assert_allclose(np.asarray(ours), want, rtol=1e-6 if dtype == np.float32 else 1e-15)
            np.testing.assert_array_equal(np.asarray(drop_in.allreduce(x, op, comm=WORLD)), np.asarray(ours))

    x = data(20)
    batched = jax.vmap(lambda v: drop_in.allreduce(v, MPI.SUM))(x)
    np.testing.assert_array_equal(np.asarray(batched), np.asarray(jax.vmap(lambda v: mpi4jax.allreduce(v, MPI.SUM))(x)))
    scalar = jax.jit(lambda v: drop_in.allreduce(jnp.vdot(v, v), MPI.SUM))(x)
    np.testing.assert_allclose(float(scalar), sum((r * r).sum() for r in WORLD.allgather(x)), rtol=1e-14)

    total = np.sum(WORLD.allgather(x), 0)
    for root in range(SIZE):
        ours, theirs = both(lambda library, v: library.reduce(v, MPI.SUM, root), x)
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
        np.testing.assert_array_equal(np.asarray(ours), total if RANK == root else x)

    special = data(21, (2, 5))
    special[0, :4] = [-0.0, np.nan, np.inf, -np.inf]
    for value in [special, special.astype(np.float32), data(22, (4,), np.complex128), data(23, (3,), np.int32),
                  data(24, (5,)) > 0]:
        ours, theirs = both(lambda library, v: library.allgather(v), value)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape == (SIZE, *value.shape)
        assert np.asarray(ours).tobytes() == np.asarray(theirs).tobytes() == np.stack(WORLD.allgather(value)).tobytes()

    # The transpose of a sum over processes is that sum (mpi4jax's is the identity).
    grad = jax.grad(lambda v: drop_in.allreduce(v, MPI.SUM).sum())(x)
    np.testing.assert_array_equal(np.asarray(grad), np.full(x.shape, float(SIZE)))

    # Forgetting processes= returns x, as lax.psum(x, ()): in a job of several processes, with a warning.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alone = jax.jit(lambda v: jaxring.allreduce(v, ()))(x)
    np.testing.assert_array_equal(np.asarray(alone), x)
    assert any("processes=True" in str(w.message) and "jaxring.mpi4jax" in str(w.message) for w in caught), caught

    def refused(call, error, *words):
        try:
            call()
        except error as e:
            assert all(word in str(e) for word in words), (words, str(e))
        else:
            raise AssertionError(f"not refused: {words}")

    refused(lambda: drop_in.allreduce(x, MPI.PROD), ValueError, "MPI.PROD", "mpi4jax.allreduce")
    refused(lambda: jax.jit(lambda v: drop_in.allreduce(v, MPI.BAND))(x), ValueError, "MPI.BAND", "mpi4jax")
    refused(lambda: drop_in.reduce(x, MPI.LXOR, 0), ValueError, "MPI.LXOR", "mpi4jax.reduce")
    refused(lambda: drop_in.allreduce(x, "sum"), TypeError, "MPI.Op")
    refused(lambda: drop_in.allreduce(x, MPI.SUM, comm=MPI.COMM_NULL), ValueError, "not in the communicator")
    alone = WORLD.Split(RANK, 0)
    between = alone.Create_intercomm(0, WORLD, 1 - RANK, 7)
    refused(lambda: drop_in.allreduce(x, MPI.SUM, comm=between), ValueError, "intercommunicator")
    refused(lambda: drop_in.reduce(x, MPI.SUM, SIZE), ValueError, "root")
    WORLD.Barrier()
    passed("drop_in")


if __name__ == "__main__":
    for name in sys.argv[1:]:
        globals()[f"check_{name}"]()
