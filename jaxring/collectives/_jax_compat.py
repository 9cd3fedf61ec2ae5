"""Every use of JAX internals (jax._src) in jaxring, in one place.

jaxring's primitive needs a few things JAX has no public API for: whether
shard_map is type-checking varying axes (check_vma), reading and setting the
varying axes of an abstract value, the mesh behind the lowering context, and
whether a traced value is one of the traced function's own inputs.
When JAX changes them, this module is the one to update.
"""

import jax
from jax._src import config as _config
from jax._src.sharding_impls import SPMDAxisContext


def checking_varying_axes() -> bool:
    """True inside jax.shard_map(check_vma=True), where avals carry their varying axes."""
    return _config._check_vma.value


def auto_pcast() -> bool:
    """True where JAX's collectives mark an input varying on their own before reducing it."""
    return _config.auto_pcast.value


def varying_axes(aval) -> frozenset:
    """The mesh axes over which `aval`'s value differs between devices."""
    return aval.mat.varying


def unreduced_or_reduced_axes(aval) -> frozenset:
    """The mesh axes over which `aval` is typed unreduced or reduced (explicit sharding)."""
    return aval.mat.unreduced | aval.mat.reduced


def with_shape_and_varying(aval, shape, varying):
    """`aval` with a new shape and set of varying axes."""
    return aval.update(shape=shape, manual_axis_type=aval.mat.update(varying=frozenset(varying)))


def spmd_mesh(lowering_context):
    """The device mesh of the pmap or shard_map being lowered, or None outside either."""
    axis_context = lowering_context.module_context.axis_context
    return axis_context.mesh if isinstance(axis_context, SPMDAxisContext) else None


# Primitives whose result XLA keeps in its operand's buffer.
_VIEWS = frozenset({"reshape", "squeeze", "expand_dims", "pvary", "pcast", "copy"})


def is_input_of_traced_function(x) -> bool:
    """Whether `x` is an argument or a captured constant of the function being traced, or a
    reshape of one: a value the program may not overwrite, which XLA would copy before an op
    writing its output over it. False for values the function computed, and for tracers of
    other traces (jvp, vmap), which this cannot see through."""
    if not isinstance(x, jax.core.Tracer):
        return True  # a concrete array: a constant of the program
    try:
        frame = x._trace.frame
        var = x.val
        eqns = frame.tracing_eqns
        for _ in range(len(eqns) + 1):
            if any(var is v for v in frame.invars) or var in frame.constvar_to_val:
                return True
            producer = next((e for e in reversed(eqns) if any(var is v for v in e.outvars)), None)
            if producer is None or producer.primitive.name not in _VIEWS:
                return False
            var = producer.in_tracers[0].val
    except AttributeError:  # not a jaxpr trace's tracer
        pass
    return False
