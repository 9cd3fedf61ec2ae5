"""jaxring/collectives/mpi_ops.py: mpi4py's MPI.Op objects named, and allreduce's refusal of one (mpi4jax's)."""

import jax.numpy as jnp
import pytest
from mpi4py import MPI

import jaxring
from jaxring.collectives import mpi_ops


def test_each_op_is_named_as_written_and_the_rings_own_mapped():
    assert [mpi_ops.name(op) for op in (MPI.SUM, MPI.PROD, MPI.MAXLOC)] == ["MPI.SUM", "MPI.PROD", "MPI.MAXLOC"]
    assert [mpi_ops.ring_name(op) for op in (MPI.SUM, MPI.MAX, MPI.MIN, MPI.BAND)] == ["sum", "max", "min", None]
    mine = MPI.Op.Create(lambda a, b, datatype: None)
    assert mpi_ops.name(mine) == "a user-defined MPI.Op" and mpi_ops.ring_name(mine) is None
    mine.Free()
    assert mpi_ops.is_op(MPI.SUM) and not mpi_ops.is_op("sum")


@pytest.mark.parametrize("op, words", [(MPI.SUM, r"op=MPI.SUM\): .*op='sum'.*import jaxring.mpi4jax"),
                                       (MPI.BAND, r"op=MPI.BAND\): .*call mpi4jax.allreduce itself for MPI.BAND")])
def test_jaxrings_own_allreduce_names_an_mpi_op_and_says_what_takes_it(op, words):
    with pytest.raises(ValueError, match=words):
        jaxring.allreduce(jnp.arange(3.0), (), op)
