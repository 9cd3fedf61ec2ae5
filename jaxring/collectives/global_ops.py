"""The all-reduce over every local device of every MPI process, called from outside pmap.

A pmap of allreduce(processes=True) over this process' devices (topology.World);
importing this module imports mpi4py, which starts MPI.
"""

import functools

import jax

from jaxring.collectives import topology
from jaxring.collectives.allreduce import allreduce

_AXIS = "jaxring_local"


def global_allreduce(x, op: str = "sum", *, timeout: float | None = None):
    """The sum, mean, max or min (`op`) of every leaf of `x` over all local devices of all processes, from outside pmap.

    `x`: a pytree of arrays whose leading axis is the number of local devices
    (as pmap returns them). The same as ``jax.pmap(lambda v:
    jaxring.allreduce(v, axis, op, processes=True), axis)(x)`` over
    `World.local_devices`, which it is; usable inside jit too.
    """
    world = topology.init()
    n_local = len(world.local_devices)
    for leaf in jax.tree_util.tree_leaves(x):
        if not hasattr(leaf, "shape") or leaf.ndim < 1 or leaf.shape[0] != n_local:
            raise ValueError(
                f"every leaf of x must have a leading axis of {n_local} (one row per local device, as "
                f"pmap returns it), got shape {getattr(leaf, 'shape', type(leaf).__name__)}"
            )
    return _global_allreduce(world.local_devices, op, timeout)(x)


@functools.cache
def _global_allreduce(devices, op, timeout):
    return jax.pmap(lambda v: allreduce(v, _AXIS, op, processes=True, timeout=timeout), _AXIS, devices=devices)
