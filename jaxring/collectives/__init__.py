"""The collectives library: the ring custom call, tensor fusion and the cross-process ops.

This layer knows nothing of training; jaxring.engine builds on it. Modules
that import mpi4py (topology, mpi, replicas) are not imported here, because
importing mpi4py starts MPI.
"""
