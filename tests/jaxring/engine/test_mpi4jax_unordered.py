"""mpi4jax_unordered.unordered: mpi4jax's results in a program that carries no effect.

One process, launched without mpirun: COMM_WORLD is this process, so a sum over it
is its input and a gather stacks it. That the steps queue behind a late process, and
that every process gets the same bits: tests/jaxring/engine/test_sync_mpi4jax.py.
(A host callback cannot hold a program here: XLA's CPU client runs one inline.)
"""

import jax
import jax.numpy as jnp
import mpi4jax
import numpy as np
from mpi4py import MPI

from jaxring.engine.mpi4jax_unordered import unordered

COMM = MPI.COMM_WORLD.Clone()


def reductions(tree):
    """Two sums and a gather over COMM, each after the one before."""
    total = mpi4jax.allreduce(tree["a"] * 3, op=MPI.SUM, comm=COMM)
    every = mpi4jax.allgather(tree["b"] + total[:2], comm=COMM)
    return {"sum": mpi4jax.allreduce(total - 1, op=MPI.SUM, comm=COMM), "every": every}


def inputs(seed):
    rng = np.random.default_rng(seed)
    return {"a": jnp.asarray(rng.normal(size=7), jnp.float32), "b": jnp.asarray(rng.normal(size=2), jnp.float32)}


def test_mpi4jaxs_results_in_a_program_that_carries_no_effect():
    tree = inputs(0)
    assert jax.make_jaxpr(reductions)(tree).effects  # mpi4jax's ordered effect
    assert not jax.make_jaxpr(unordered(reductions))(tree).effects
    ours, theirs = jax.jit(unordered(reductions))(tree), jax.jit(reductions)(tree)
    a, b = np.asarray(tree["a"]), np.asarray(tree["b"])
    np.testing.assert_array_equal(ours["sum"], np.float32(3) * a - 1)
    np.testing.assert_array_equal(ours["every"], (b + np.float32(3) * a[:2])[None])
    for key in ours:
        np.testing.assert_array_equal(ours[key], theirs[key])
    eager = unordered(reductions)(tree)  # outside jit: mpi4jax's own calls
    np.testing.assert_array_equal(eager["sum"], ours["sum"])

