"""jaxring.reduce_scatter: lax.psum_scatter over the ring.

The device's block of the sum is the ring's reduce-scatter of the blocks laid out along the
scatter dimension, one contiguous chunk per device; lax's refusals are arguments.py's.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxring.collectives import _ffi, ring_primitive
from jaxring.collectives.arguments import (as_supported_array, canonical_axis, checked_axes, is_pytree, not_numbers,
                                           timeout_ms as checked_timeout_ms, unreduced_as_varying, wider_type)
from jaxring.collectives.kinds import REDUCE_SCATTER


def reduce_scatter(x, axis_name, *, scatter_dimension=0, axis_index_groups=None, tiled=False, timeout=None):
    """The device's block of the sum of `x` over `axis_name`, as jax.lax.psum_scatter.

    Untiled, `x.shape[scatter_dimension]` must equal the number of devices N
    and the device at axis position r gets sum[..., r, ...] (that dimension
    dropped); tiled, it must be a multiple of N and the device gets the r-th
    of N equal blocks along it. With `axis_index_groups`, N is a group's size and the
    position is within the group. `axis_name` may be one vmap axis, as lax's. A pytree
    is scattered leaf by leaf.
    """
    _ffi.register()  # every op, a ring of one too: the settings' errors come at once
    if is_pytree(x):
        return jax.tree_util.tree_map(
            lambda leaf: reduce_scatter(leaf, axis_name, scatter_dimension=scatter_dimension,
                                        axis_index_groups=axis_index_groups, tiled=tiled, timeout=timeout), x)
    if not_numbers(x):
        return jax.lax.psum_scatter(x, axis_name, scatter_dimension=scatter_dimension, tiled=tiled,
                                    axis_index_groups=axis_index_groups)
    x = jnp.asarray(x)
    # Out of range, lax.psum_scatter raises IndexError, before it looks at the dtype; numpy's
    # AxisError is one, and the ValueError jaxring raised before.
    if x.ndim == 0:
        raise np.exceptions.AxisError(
            f"jaxring.reduce_scatter of a 0-dimensional x: it scatters blocks of x along "
            f"scatter_dimension={scatter_dimension!r}, as lax.psum_scatter; sum a scalar with jaxring.allreduce"
        )
    dim = canonical_axis(scatter_dimension, x.ndim, "scatter_dimension", np.exceptions.AxisError)
    names, ranks, groups = checked_axes(axis_name, REDUCE_SCATTER, axis_index_groups)
    x = unreduced_as_varying(x, names, "reduce_scatter", groups)
    lax_op = functools.partial(jax.lax.psum_scatter, x, names, scatter_dimension=dim, tiled=tiled,
                               axis_index_groups=groups)
    if x.dtype == jnp.bool_:
        lax_op()  # lax.psum_scatter refuses bools (lax.add does not take them): the same TypeError
    if (wide := wider_type(x.dtype)) is not None:
        return reduce_scatter(x.astype(wide), names, scatter_dimension=dim, axis_index_groups=groups, tiled=tiled,
                              timeout=timeout).astype(x.dtype)
    x = as_supported_array(x, "reduce_scatter")
    timeout_ms = checked_timeout_ms(timeout)
    size = x.shape[dim]
    if (size % ranks if tiled else size != ranks):
        raise ValueError(
            f"reduce_scatter over {ranks} devices needs dimension {dim} of x "
            f"{'to be a multiple of' if tiled else 'to equal'} {ranks}, got shape {x.shape}"
        )
    if ranks == 1:
        return ring_primitive.ring_of_one(lax_op, lambda: x if tiled else jnp.squeeze(x, dim))
    if x.size == 0:
        return lax_op()
    # Device r's block must be the r-th contiguous chunk of the flat buffer.
    blocks = jnp.moveaxis(x, dim, 0)
    mine = ring_primitive.bind(blocks.reshape(-1), kind=REDUCE_SCATTER, names=names, timeout_ms=timeout_ms,
                               groups=groups)
    mine = mine.reshape((size // ranks,) + blocks.shape[1:])
    return jnp.moveaxis(mine, 0, dim) if tiled else mine[0]
