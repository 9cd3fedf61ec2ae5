"""lax's axis_index_groups inside a ring: a device's place among the groups, and groups of different sizes.

Groups of one size each run their own ring (primitive.py lowers one ring per group). Groups of
different sizes, which lax.psum sums on CPU and GPU, cannot: the handlers run rings of one size.
They run one ring over the whole axis on a row per group instead (in_rows_by_group), len(groups)
times the bytes.
"""

import jax
import jax.numpy as jnp
import numpy as np


def sizes_differ(groups) -> bool:
    """Whether lax's axis_index_groups `groups` (or None) hold groups of different sizes."""
    return groups is not None and len({len(group) for group in groups}) > 1


def in_rows_by_group(x, names, groups, reduction, reduce_whole_axis):
    """`x` reduced within each of `groups` of different sizes by `reduce_whole_axis` (a reduction over
    the whole axis of a 1-D array): one ring holds a row per group, no longer one ring per group.
    Each device puts `x` in its group's row and the reduction's identity in the others (-0.0 for a
    float sum, which leaves every sum's bits as they were), the whole axis reduces every row at once,
    and each device keeps its group's row."""
    mine = own_group(names, groups)
    rows = jnp.arange(len(groups)).reshape((-1,) + (1,) * x.ndim) == mine
    stacked = jnp.where(rows, x[None], _identity(x.dtype, reduction))
    total = reduce_whole_axis(stacked.reshape(-1)).reshape(stacked.shape)
    return jax.lax.dynamic_index_in_dim(total, mine, keepdims=False)


def own_group(names, groups):
    """This device's index among `groups` (traced)."""
    return _own_place(names, groups, lambda index, group: index)


def position_in_own_group(names, groups):
    """This device's position in its group of `groups`, or along `names` where `groups` is None (traced)."""
    if groups is None:
        return jax.lax.axis_index(names)
    return _own_place(names, groups, lambda index, group: np.arange(len(group)))


def _own_place(names, groups, place):
    """`place(index, group)` of this device's group (a number, or one per member of the group), traced."""
    table = np.zeros(sum(map(len, groups)), np.int32)
    for index, group in enumerate(groups):
        table[list(group)] = place(index, group)
    return jnp.asarray(table)[jax.lax.axis_index(names)]


def _identity(dtype, reduction):
    """The value that leaves `reduction` ("sum", "max", "min") unchanged, in `dtype`."""
    if reduction == "sum":
        return jnp.array(-0.0 if jnp.issubdtype(dtype, jnp.inexact) else 0, dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.array(-jnp.inf if reduction == "max" else jnp.inf, dtype)
    info = jnp.iinfo(dtype) if dtype != jnp.bool_ else None
    if info is None:
        return jnp.array(reduction == "min", dtype)
    return jnp.array(info.min if reduction == "max" else info.max, dtype)
