"""The collectives library: the ring custom call, tensor fusion and the cross-process ops.

This layer knows nothing of training; jaxring.engine builds on it. Each public op has a
module of its own (allreduce.py, reduce_scatter.py, all_gather.py; jaxring/__init__.py
exports them), over ring_primitive.py (the one primitive and its rules), arguments.py
(lax's arguments and refusals) and index_groups.py; fusion.py's tree_allreduce fuses a
pytree into few all-reduces. across_processes.py is the ops' one way to MPI. Modules
that import mpi4py (topology, mpi, replicas, global_ops) are not imported here, because
importing mpi4py starts MPI.
"""
