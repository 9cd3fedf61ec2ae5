"""jaxring.all_gather: lax.all_gather over the ring, with lax's `to` ("varying", "invarying", "reduced").

Every device's block, in axis order, is the ring's all-gather of a flat buffer; types narrower than
the handlers take move as their bits or widened; lax's refusals are arguments.py's.
"""

import functools

import jax
import jax.numpy as jnp

from jaxring.collectives import _ffi, _jax_compat, kinds, ring_primitive
from jaxring.collectives.arguments import (as_supported_array, canonical_axis, checked_axes, is_pytree, not_numbers,
                                           timeout_ms as checked_timeout_ms, wider_type)
from jaxring.collectives.kinds import ALL_GATHER


ALL_GATHER_TO = ("varying", "invarying", "reduced")  # lax.all_gather's `to`


def all_gather(x, axis_name, *, axis_index_groups=None, axis=0, tiled=False, to="varying", timeout=None):
    """Every device's `x`, in axis order, stacked along a new `axis` (as jax.lax.all_gather).

    Tiled, the blocks are concatenated along the existing `axis` instead.
    `all_gather(reduce_scatter(x, a, tiled=True), a, tiled=True)` equals `allreduce(x, a)`.
    With `axis_index_groups`, the devices of each group gather each other's `x`.
    `to="invarying"` is the same value; under shard_map(check_vma=True) it is typed
    invariant over the axes and its transpose hands each device its own block of the
    cotangent, as lax's. `to="reduced"` (explicit sharding, under check_vma) types it reduced
    over the axes; its transpose reduce-scatters the unreduced cotangent. A pytree is gathered
    leaf by leaf.
    """
    _ffi.register()  # every op, a ring of one too: the settings' errors come at once
    _check_all_gather_to(to, axis_index_groups)
    if is_pytree(x):
        return jax.tree_util.tree_map(
            lambda leaf: all_gather(leaf, axis_name, axis_index_groups=axis_index_groups, axis=axis, tiled=tiled,
                                    to=to, timeout=timeout), x)
    if not_numbers(x):
        return jax.lax.all_gather(x, axis_name, axis_index_groups=axis_index_groups, axis=axis, tiled=tiled, to=to)
    x = jnp.asarray(x)
    if (wide := wider_type(x.dtype)) is not None:
        # Moved, not computed: 8-bit floats as their bits (a NaN's payload kept), 4-bit types widened.
        narrow, bits = x.dtype, jnp.issubdtype(x.dtype, jnp.floating) and jnp.finfo(x.dtype).bits == 8
        moved = jax.lax.bitcast_convert_type(x, jnp.uint8) if bits else x.astype(wide)
        gathered = all_gather(moved, axis_name, axis_index_groups=axis_index_groups, axis=axis, tiled=tiled, to=to,
                              timeout=timeout)
        return jax.lax.bitcast_convert_type(gathered, narrow) if bits else gathered.astype(narrow)
    x = as_supported_array(x, "all_gather")
    timeout_ms = checked_timeout_ms(timeout)
    names, ranks, groups = checked_axes(axis_name, ALL_GATHER, axis_index_groups)
    if tiled and x.ndim == 0:
        raise ValueError("all_gather(tiled=True) concatenates along an axis of x; x is a scalar")
    axis = canonical_axis(axis, x.ndim if tiled else x.ndim + 1, "axis")
    lax_op = functools.partial(jax.lax.all_gather, x, names, axis=axis, tiled=tiled, axis_index_groups=groups, to=to)
    if ranks == 1:
        return ring_primitive.ring_of_one(lax_op, lambda: x if tiled else jnp.expand_dims(x, axis))
    if x.size == 0:
        return lax_op()
    gather = functools.partial(_gathered, names=names, ranks=ranks, groups=groups, timeout_ms=timeout_ms, axis=axis,
                               tiled=tiled)
    if to == "invarying" and _jax_compat.checking_varying_axes():
        return _gathered_invariant(gather, x, names, axis, tiled)
    if to == "reduced":
        if not _jax_compat.checking_varying_axes():
            return lax_op()  # lax refuses it, on a value no type calls varying
        # Varying -> reduced, as lax's all_gather_reduced: the transpose is the ring's reduce-scatter of
        # the (unreduced) cotangent.
        return kinds.retyped(gather(x), names, "varying", "reduced")
    return gather(x)


def _gathered(x, *, names, ranks, groups, timeout_ms, axis, tiled):
    flat = ring_primitive.bind(x.reshape(-1), kind=ALL_GATHER, names=names, timeout_ms=timeout_ms, groups=groups)
    stacked = jnp.moveaxis(flat.reshape((ranks,) + x.shape), 0, axis)
    if not tiled:
        return stacked
    return stacked.reshape(x.shape[:axis] + (ranks * x.shape[axis],) + x.shape[axis + 1 :])


def _gathered_invariant(gather, x, names, axis, tiled):
    """gather(x) typed invariant over `names` (lax.all_gather(to="invarying") under check_vma).

    The gathered value is the same on every device, so its cotangent is too, and each device's
    `x` owns one block of it: the transpose slices that block out, with no communication.
    (kinds.invariant_p's own transpose would hand each device the whole cotangent, as a sum's.)
    """
    x = kinds.typed_input(x, names, ALL_GATHER)  # varying over `names`, as the cotangent's slice will be
    block = x.shape[axis] if tiled else 1

    def gather_invariant(_, x):
        return kinds.invariant_p.bind(gather(x), names=names)

    def own_block(_, cotangent):
        mine = jax.lax.dynamic_slice_in_dim(cotangent, jax.lax.axis_index(names) * block, block, axis)
        return mine if tiled else jnp.squeeze(mine, axis)

    # A custom_jvp whose tangent is a linear_call: forward mode, reverse mode (the tangent's transpose
    # is own_block) and higher orders, as lax's.
    @jax.custom_jvp
    def gathered(x):
        return gather_invariant(None, x)

    @gathered.defjvp
    def _(primals, tangents):
        return gathered(*primals), jax.custom_derivatives.linear_call(gather_invariant, own_block, None, *tangents)

    return gathered(x)


def _check_all_gather_to(to, groups):
    """lax.all_gather's `to`: its values, and the ones jaxring refuses, named, at trace time."""
    if to not in ALL_GATHER_TO:
        raise ValueError(
            f"Got unexpected `to` value for `jaxring.all_gather`: {to!r}. Allowed `to` values are: {ALL_GATHER_TO}"
        )
    if to == "varying":
        return
    if groups is not None:
        raise NotImplementedError(f"jaxring.all_gather(..., to={to!r}) with axis_index_groups: lax refuses it too")
