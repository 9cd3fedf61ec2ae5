"""mpi4py's MPI.Op objects (mpi4jax's spelling of a reduction) by name, for jaxring.mpi4jax and allreduce's refusals.

It imports no mpi4py (importing it starts MPI): an MPI.Op exists only where the caller imported it.
"""

import sys

# mpi4py's name -> jaxring.allreduce's, for the reductions the ring does.
RING = {"SUM": "sum", "MAX": "max", "MIN": "min"}
OTHERS = ("PROD", "LAND", "BAND", "LOR", "BOR", "LXOR", "BXOR", "MAXLOC", "MINLOC", "REPLACE", "NO_OP")


def is_op(op) -> bool:
    """Whether `op` is an mpi4py MPI.Op."""
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and isinstance(op, mpi.Op)


def name(op) -> str:
    """The MPI.Op `op` as a user writes it: "MPI.SUM", "MPI.PROD", ... or "a user-defined MPI.Op"."""
    mpi = sys.modules["mpi4py.MPI"]
    return next((f"MPI.{n}" for n in (*RING, *OTHERS) if op == getattr(mpi, n, None)), "a user-defined MPI.Op")


def ring_name(op) -> str | None:
    """jaxring.allreduce's op for the MPI.Op `op` ("sum", "max", "min"), or None where the ring cannot do it."""
    return RING.get(name(op).removeprefix("MPI."))
