"""The ops' arguments as lax takes them, and lax's refusals of the rest, at trace time.

Every check here copies what jax.lax's collectives accept and the error they raise
otherwise (scripts/dev/lax_conformance.py counts the calls of JAX's own tests jaxring takes),
so that allreduce.py, reduce_scatter.py and all_gather.py refuse what lax refuses, in
lax's exception classes, with words that say what to change. No refusal may wait for
vmap's batching rule (primitive.py), which may run after the op returned.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxring.collectives import _ffi, _jax_compat, index_groups, kinds, timeout as timeout_lib
from jaxring.collectives.kinds import ALLREDUCE

# allreduce's ops: lax.psum, pmean, pmax, pmin.
LAX_OPS = {"sum": jax.lax.psum, "mean": jax.lax.pmean, "max": jax.lax.pmax, "min": jax.lax.pmin}
OPS = tuple(LAX_OPS)
# What the ring takes (float64, int64, uint64 and complex128 exist only under jax_enable_x64).
SUPPORTED_DTYPES = tuple(jnp.dtype(name) for name in _ffi.element_types())


def axis_names(axis_name):
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def ring_size(names):
    size = 1
    for name in names:
        size *= jax.lax.axis_size(name)
    return size


def not_numbers(x):
    """float0 and object arrays: lax's collectives refuse them (all but all_gather of a float0 constant),
    each its own way, so jaxring hands them to lax for the same error (or result)."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and (dtype == jax.dtypes.float0 or dtype == np.dtype(object))


def device_names(names):
    """The names among `names` that map devices; the others are vmap's, reduced inside the program
    (primitive.py's batching rule)."""
    devices = _jax_compat.device_axes()
    return tuple(name for name in names if name in devices)


def checked_axes(axis_name, kind, groups=None):
    """`axis_name` as a tuple, the ring's size (a group's where `groups` splits the axis) and the groups,
    checked as lax checks them.

    Only an all-reduce takes a vmap axis among device axes: lax's all_gather and psum_scatter
    refuse one in a tuple, and every op refuses axis_index_groups over a vmap axis."""
    op_name = kind.name
    names = axis_names(axis_name)
    sizes = _jax_compat.bound_axis_sizes()
    for name in names:
        if name not in sizes:
            raise NameError(
                f"Found an unbound axis name: {name}. To fix this, please call jaxring.{op_name} under "
                f"`jax.shard_map` or `jax.pmap` mapping an axis named {name!r} (or `jax.vmap(..., axis_name={name!r})`)"
            )
    vmapped = [name for name in names if name not in device_names(names)]
    if vmapped and len(names) > 1 and kind is not ALLREDUCE:
        raise NotImplementedError(
            f"jaxring.{op_name} over {names}, of which {vmapped} is a vmap axis: as lax.{kind.lax_twin}, it runs over "
            "one vmap axis alone or over device axes only; call it once per axis"
        )
    ring = int(np.prod([sizes[name] for name in names]))
    if groups is None:
        return names, ring, None
    groups = _checked_groups(groups, names, ring, op_name, kind is ALLREDUCE)
    if vmapped:
        raise NotImplementedError(
            f"axis_index_groups not supported in vmap collectives (as in jax.lax): jaxring.{op_name} over {names}, "
            f"of which {vmapped} is a vmap axis; map it with jax.pmap or jax.shard_map to split it into groups"
        )
    return names, len(groups[0]), groups


def _checked_groups(groups, names, ring, op_name, sizes_may_differ=False):
    """lax's axis_index_groups as a tuple of tuples: every index of the axis once, in groups of one
    size unless `sizes_may_differ` (an all-reduce: lax sums groups of different sizes on CPU and GPU)."""
    groups = tuple(tuple(int(i) for i in group) for group in groups)
    if sorted(i for group in groups for i in group) != list(range(ring)):
        raise ValueError(
            f"axis_index_groups must cover all indices exactly once: jaxring.{op_name} over {names} "
            f"({ring} devices) got {groups}; list each of 0..{ring - 1} in exactly one group"
        )
    if index_groups.sizes_differ(groups) and not sizes_may_differ:
        raise ValueError(
            f"axis_index_groups must all be the same size: jaxring.{op_name} runs one ring per group, "
            f"all of one size, got groups of sizes {[len(group) for group in groups]}"
        )
    return groups


def is_pytree(x) -> bool:
    """Whether `x` holds leaves in a container (lax's collectives map over them) rather than being one."""
    return not jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(x))


def wider_type(dtype):
    """The type an element type narrower than every type the handlers take crosses the ring in,
    holding each of its values exactly (None where the handlers take `dtype`): floats of under
    16 bits (float8s, float4) in float32, where a sum rounds once, as bfloat16's does; integers of
    under 8 bits in 8 bits, whose wrapped sums wrap alike when cast back."""
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 16:
        return jnp.dtype(jnp.float32)
    if jnp.issubdtype(dtype, jnp.integer) and jnp.iinfo(dtype).bits < 8:
        return jnp.dtype(jnp.int8 if jnp.issubdtype(dtype, jnp.signedinteger) else jnp.uint8)
    return None


def as_supported_array(x, op_name):
    x = jnp.asarray(x)
    if x.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise TypeError(f"jaxring.{op_name} takes arrays of {names}, got {x.dtype}; cast the array first")
    return x


def timeout_ms(timeout):
    """The handler's timeout attribute: milliseconds, 0 for the default, -1 for none."""
    if timeout is None:
        timeout_lib.default_timeout()  # parses $JAXRING_TIMEOUT_S and hands it to the handlers
        return 0
    seconds = timeout_lib.check(timeout)
    return -1 if seconds == float("inf") else max(1, int(round(seconds * 1000)))


def canonical_axis(axis, ndim, what, error=ValueError):
    if not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
        raise error(f"{what}={axis!r} is not an axis of a {ndim}-dimensional result or input")
    return int(axis) % ndim


WIRE_DTYPES = ("bfloat16", "float16", "float32")


def checked_wire_dtype(wire_dtype, processes):
    """allreduce's (and tree_allreduce's) wire_dtype as a numpy dtype, or None."""
    if wire_dtype is None:
        return None
    name = np.dtype(wire_dtype).name if not isinstance(wire_dtype, str) else wire_dtype
    if name not in WIRE_DTYPES:
        raise ValueError(f"jaxring.allreduce(wire_dtype={wire_dtype!r}): the chunks cross processes as one of "
                         f"{WIRE_DTYPES}, or None for the accumulation type")
    if processes is False:
        raise ValueError(f"jaxring.allreduce(wire_dtype={name!r}) is the dtype of what crosses processes; "
                         "pass processes=True (or a communicator), or drop wire_dtype")
    return np.dtype(jnp.dtype(name))


def refuse_vmap_axes_when_typed(flat, names, kind):
    """Under shard_map(check_vma=True) lax refuses every collective over a vmap axis, which no value's
    type varies over: a sum of a value varying over the tuple's device axes with lax.psum's ValueError,
    anything else on a bare assertion in JAX's pvary (jax 0.10.2). jaxring raises the same classes, with words."""
    vmapped = [name for name in names if name not in device_names(names)]
    if not vmapped:
        return
    varies = _jax_compat.varying_axes(jax.typeof(flat)).intersection(names)
    error = ValueError if kind.sums and varies else AssertionError
    raise error(
        f"jaxring.{kind.name} over {names} under jax.shard_map(check_vma=True): {vmapped} is a vmap axis, which no "
        f"value's type varies over, and lax.{kind.lax_twin} refuses it there too. Pass check_vma=False to jax.shard_map"
    )


def unreduced_as_varying(x, names, op_name, groups):
    """`x` typed unreduced over all of `names` (explicit sharding: each device holds a part of a sum)
    as the varying input of the ring's sum, as lax.psum and psum_scatter take one (their
    unreduced_psum and unreduced_psum_scatter); the transpose types the cotangent reduced. Any other
    value as it is (kinds.typed_input refuses one unreduced over some of `names` only)."""
    if not names or not _jax_compat.checking_varying_axes():
        return x
    if not _jax_compat.axes_in_state(jax.typeof(x), "unreduced").issuperset(names):
        return x
    if groups is not None:
        raise NotImplementedError(f"jaxring.{op_name} of an unreduced value with axis_index_groups: lax refuses it too")
    return kinds.retyped(x, names, "unreduced", "varying")
