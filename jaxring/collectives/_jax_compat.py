"""Every use of JAX internals (jax._src) in jaxring, in one place.

jaxring's primitive needs a few things JAX has no public API for: whether
shard_map is type-checking varying axes (check_vma), reading and setting the
varying axes of an abstract value, the mesh behind the lowering context,
whether a traced value was computed by the program being traced,
re-deciding a primitive's params at every bind, and whether JAX has started
its backends (XLA's clients) yet, which bound axis names map devices (the
rest are vmap's), lax's own roofline rules, running a primitive outside jit
(compiled once per shape and params), whether jit partitions a program itself,
which of a program's effects are ordered (jaxring/engine/mpi4jax_unordered.py), and
a lowering context with one more operand than its primitive has (the MPI leg's plan).
When JAX changes them, this module is the one to update.
"""

import importlib

from jax._src import config as _config, core as _core, dispatch as _dispatch, effects as _effects, mesh as _mesh
from jax._src import xla_bridge as _xla_bridge
from jax._src.interpreters import partial_eval as _pe
from jax._src.sharding_impls import ShardingContext, SPMDAxisContext


def checking_varying_axes() -> bool:
    """True inside jax.shard_map(check_vma=True), where avals carry their varying axes."""
    return _config._check_vma.value


def auto_pcast() -> bool:
    """True where JAX's collectives mark an input varying on their own before reducing it."""
    return _config.auto_pcast.value


def varying_axes(aval) -> frozenset:
    """The mesh axes over which `aval`'s value differs between devices."""
    return axes_in_state(aval, "varying")


def unreduced_or_reduced_axes(aval) -> frozenset:
    """The mesh axes over which `aval` is typed unreduced or reduced (explicit sharding)."""
    return axes_in_state(aval, "unreduced") | axes_in_state(aval, "reduced")


def axes_in_state(aval, state) -> frozenset:
    """The mesh axes over which `aval` is typed `state`: "varying", "reduced" or "unreduced" (each device
    holds a part of a sum over them)."""
    return getattr(aval.mat, state)


def with_axes_moved(aval, names, from_state, to_state):
    """`aval` with the axes `names` moved from one of its states ("varying", "reduced", "unreduced") to another."""
    states = {state: axes_in_state(aval, state) for state in ("varying", "reduced", "unreduced")}
    states[from_state] = states[from_state] - frozenset(names)
    states[to_state] = states[to_state] | frozenset(names)
    return aval.update(manual_axis_type=aval.mat.update(**states))


def with_shape_and_varying(aval, shape, varying):
    """`aval` with a new shape and set of varying axes."""
    return aval.update(shape=shape, manual_axis_type=aval.mat.update(varying=frozenset(varying)))


def spmd_mesh(lowering_context):
    """The device mesh of the pmap or shard_map being lowered, or None outside either."""
    axis_context = lowering_context.module_context.axis_context
    return axis_context.mesh if isinstance(axis_context, SPMDAxisContext) else None


# Primitives whose result XLA keeps in its operand's buffer.
_VIEWS = frozenset({"reshape", "squeeze", "expand_dims", "pvary", "pcast", "copy"})


def is_computed_in(trace, x) -> bool:
    """Whether `x`, an operand bound in `trace`, is a value an operation of the program traced
    there computed, rather than one of its arguments, captured constants or literals, or a
    reshape of one: those the program may not overwrite, and XLA would copy them before an op
    writing its output over them. Anything JAX can hand a primitive may come here: Python and
    numpy scalars, arrays, literals, tracers of any trace. Outside a jaxpr trace (eager, vmap,
    jvp), False: those traces bind the primitive again in the one below, which decides."""
    while isinstance(x, _pe.DynamicJaxprTracer) and x._trace is trace:
        producer = x.parent  # the equation that computed x; None for arguments, constants, literals
        if producer is None:
            return False
        if producer.primitive.name not in _VIEWS:
            return True
        x = producer.in_tracers[0]
    return False


def decide_params_at_every_bind(primitive, decide):
    """Have `primitive` set its params to `decide(trace, operands, params)` each time it is bound
    in a trace, the batching, differentiation and re-tracing rules' binds included, so a param
    that depends on the operand is decided for the operand that trace actually binds."""

    def bind_with_trace(trace, operands, avals, params):
        return _core.Primitive.bind_with_trace(primitive, trace, operands, avals, decide(trace, operands, params))

    primitive.def_bind_with_trace(bind_with_trace)


def backends_started() -> bool:
    """True once JAX has made its XLA clients (the first use of a device): settings XLA reads
    from the environment when it makes a client no longer apply."""
    return bool(_xla_bridge._backends)


def bound_axis_sizes() -> dict:
    """Every axis name bound where the caller traces (pmap's, shard_map's and vmap's), to its size."""
    return dict(_core.get_axis_env().axis_sizes)


def device_axes() -> frozenset:
    """The bound axis names that map devices (pmap's and shard_map's manual axes); the others are vmap's."""
    return frozenset(_mesh.get_abstract_mesh().manual_axes)


def lax_roofline_rules() -> dict:
    """jax.experimental.roofline's rules for lax's ring collectives, by the lax op each stands for."""
    from jax._src.lax import parallel as _parallel

    # The module, not the function of the same name that its package exports; the package registers lax's rules.
    rules = importlib.import_module("jax.experimental.roofline.roofline")._rooflines
    return {
        "psum": lambda ctx, *args, axes: rules[_parallel.psum_invariant_p](ctx, *args, axes=axes),
        "psum_scatter": lambda ctx, *args, axes: rules[_parallel.reduce_scatter_p](ctx, *args, axis_name=axes),
        "all_gather": lambda ctx, *args, axes: rules[_parallel.all_gather_p](ctx, *args, axis_name=axes),
    }


def run_eagerly(primitive, *args, **params):
    """`primitive` applied outside jit: JAX compiles it alone, once per shape and params (its impl rule)."""
    return _dispatch.apply_primitive(primitive, *args, **params)


def devices_partitioned_over(lowering_context) -> int:
    """How many devices jit partitions the program being lowered over by itself (its sharding
    propagation, outside pmap and shard_map); 1 where it runs on one device or per device."""
    axis_context = lowering_context.module_context.axis_context
    return axis_context.num_devices if isinstance(axis_context, ShardingContext) else 1


def with_scalar_operand(lowering_context, dtype):
    """`lowering_context` for a rule that lowers to a call with one more operand than its primitive
    has, a scalar of `dtype` (a constant the rule makes): jax.ffi.ffi_lowering reads the operands'
    types from the context."""
    return lowering_context.replace(avals_in=[*lowering_context.avals_in, _core.ShapedArray((), dtype)])


def ordered_effects(effects) -> tuple:
    """Those of `effects` that JAX orders across programs (mpi4jax registers its own among them)."""
    return tuple(_effects.ordered_effects.filter_in(effects))
