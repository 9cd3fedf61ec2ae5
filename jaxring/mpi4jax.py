"""mpi4jax's reductions by jaxring's MPI leg: `import jaxring.mpi4jax as mpi4jax` in place of `import mpi4jax`.

allreduce, reduce and allgather take mpi4jax 0.9's arguments (an mpi4py MPI.Op, `comm=`
defaulting to MPI.COMM_WORLD) and return what it returns (the array alone, no token), in
jit on one device, outside jit and under vmap; each is one jaxring.allreduce(x, (),
processes=comm). On purpose they differ from mpi4jax (docs/USAGE.md, "Coming from mpi4jax"):
the gradient of a sum is the sum of the cotangents (mpi4jax's is the cotangent alone); a
wait is bounded by jaxring's timeout (jaxring.set_default_timeout); there is no
point-to-point, so halos stay with mpi4jax's sendrecv on the same communicator.

Importing this module imports mpi4py, which starts MPI (as `import mpi4jax` does).
"""

import jax
import jax.numpy as jnp
import numpy as np
from mpi4py import MPI

import jaxring
from jaxring.collectives import mpi_ops


def allreduce(x, op, *, comm=None):
    """The reduction `op` (MPI.SUM, MPI.MAX or MPI.MIN) of `x` over the processes of `comm`
    (None: MPI.COMM_WORLD), the same bits on every process, as mpi4jax.allreduce."""
    # One array, as mpi4jax's: jaxring.allreduce would reduce a list's entries as the leaves of a tree.
    x = jnp.asarray(x)
    return jaxring.allreduce(x, (), _ring_op(op, "allreduce"), processes=_communicator(comm, "allreduce"))


def reduce(x, op, root, *, comm=None):
    """mpi4jax.reduce: the reduction on the process of rank `root` in `comm`, the input
    unchanged on the others. The ring reduces everywhere: the others' results are dropped."""
    comm = _communicator(comm, "reduce")
    if not isinstance(root, (int, np.integer)) or not 0 <= root < comm.Get_size():
        raise ValueError(f"jaxring.mpi4jax.reduce(root={root!r}): root is a rank of the communicator, "
                         f"0 to {comm.Get_size() - 1}")
    x = jnp.asarray(x)
    total = jaxring.allreduce(x, (), _ring_op(op, "reduce"), processes=comm)
    # Not `x` alone off the root: jit would drop the unused leg there (it declares no effect), and the others' wait.
    return jnp.where(comm.Get_rank() == root, total, x)


def allgather(x, *, comm=None):
    """mpi4jax.allgather: every process' `x`, stacked in rank order along a new first axis.

    A sum of rows that are zero but this process' own, summed as unsigned integers of the
    elements' width so that every bit crosses as it is (a float's -0.0 and NaN payloads too):
    the ring moves twice the bytes an MPI_Allgather would."""
    comm = _communicator(comm, "allgather")
    x = jnp.asarray(x)
    bits = _as_unsigned(x)
    rows = jnp.zeros((comm.Get_size(), *bits.shape), bits.dtype).at[comm.Get_rank()].set(bits)
    return _from_unsigned(jaxring.allreduce(rows, (), "sum", processes=comm), x.dtype)


def _ring_op(op, function):
    if not isinstance(op, MPI.Op):
        raise TypeError(f"jaxring.mpi4jax.{function}(op={op!r}): op is an mpi4py MPI.Op, one of MPI.SUM, MPI.MAX, "
                        "MPI.MIN (as mpi4jax's); jaxring.allreduce itself takes op='sum', 'mean', 'max' or 'min'")
    ring = mpi_ops.ring_name(op)
    if ring is None:
        which = mpi_ops.name(op)
        raise ValueError(f"jaxring.mpi4jax.{function}(op={which}): jaxring's ring does MPI.SUM, MPI.MAX and MPI.MIN "
                         f"only; call mpi4jax.{function} itself for {which} (the two mix in one program)")
    return ring


def _communicator(comm, function):
    """`comm` (None: MPI.COMM_WORLD), checked before any process waits for another."""
    comm = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"jaxring.mpi4jax.{function}(comm={comm!r}): comm is an mpi4py communicator "
                        "(MPI.COMM_WORLD or one split from it), or None for MPI.COMM_WORLD")
    if comm == MPI.COMM_NULL:
        raise ValueError(f"jaxring.mpi4jax.{function}(comm=MPI.COMM_NULL): this process is not in the communicator "
                         "(Comm.Split gives COMM_NULL to a process that passed MPI.UNDEFINED); call it only in the "
                         "processes of the communicator, each with the communicator it got")
    if comm.Is_inter():
        raise ValueError(f"jaxring.mpi4jax.{function}(comm=an intercommunicator): the ring reduces within one group "
                         "of processes; pass an intracommunicator (Intercomm.Merge gives one), as mpi4jax requires")
    return comm


def _as_unsigned(x):
    """`x`'s bits as unsigned integers of its elements' width (a complex number's parts on a last axis of 2)."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint8)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        x = jnp.stack([x.real, x.imag], axis=-1)
    return jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}"))


def _from_unsigned(bits, dtype):
    if dtype == jnp.bool_:
        return bits.astype(jnp.bool_)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        parts = jax.lax.bitcast_convert_type(bits, jnp.finfo(dtype).dtype)
        return jax.lax.complex(parts[..., 0], parts[..., 1])
    return jax.lax.bitcast_convert_type(bits, dtype)
