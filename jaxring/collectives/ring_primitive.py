"""`ring_p`, the one primitive of the three ring ops, and its rules: abstract eval, lowering, transpose,
jvp and vmap batching.

Each bind is one XLA custom call (_ring_call.py): the handlers of the devices along the mapped
axis wait for each other's progress (on CPU the engine of csrc/cpu/cpu_engine.h, which runs
csrc/core/ring_protocol.h; on CUDA the engines of docs/CUDA_RING.md) and run one of the paths of
docs/ARCHITECTURE.md. The devices of each ring, in axis order, are read from the mesh when the op
is lowered (_rings); axis_index_groups split each ring into one ring per group. What differs
between the three ops is one row each of kinds.py; the rest of a bind is one RingParams.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core
from jax.interpreters import ad, batching, mlir

from jaxring.collectives import (_ffi, _jax_compat, _ring_call, accumulation, across_processes, arguments,
                                 index_groups, jax_tools, kinds)
from jaxring.collectives.kinds import ALL_GATHER, ALLREDUCE, REDUCE_SCATTER

ring_p = core.Primitive(_ffi.target_name())


# Hashed with the rest of a jaxpr's params at every bind; `kind` is hashed by identity (kinds.Kind).
@dataclasses.dataclass(frozen=True)
class RingParams:
    """ring_p's one param: what a bind runs, on which devices, and how."""

    kind: kinds.Kind
    axis_name: tuple  # the device axes of the ring (vmap's are taken out by the batching rule)
    ranks: int  # the devices of one ring: every name's (vmap's too, until batched), or a group's
    op_id: int  # the handlers of one op meet by it (_ring_call.next_op_id)
    timeout_ms: int  # arguments.timeout_ms
    reduction: str = "sum"  # "sum", "max" or "min", where the kind reduces
    groups: tuple | None = None  # lax's axis_index_groups, a tuple of tuples; None for the whole axis
    in_place: bool = False  # the output may take the input's buffer: decided at every bind (_in_place)


def bind(flat, *, kind, names, timeout_ms, reduction="sum", groups=None):
    """One ring op on a 1-D array, typed under check_vma as lax's op takes its input."""
    if _jax_compat.checking_varying_axes():
        arguments.refuse_vmap_axes_when_typed(flat, names, kind)
        flat = kinds.typed_input(flat, names, kind)
    ranks = len(groups[0]) if groups else arguments.ring_size(names)
    return ring_p.bind(flat, params=RingParams(kind=kind, axis_name=names, ranks=ranks, op_id=_ring_call.next_op_id(),
                                               timeout_ms=timeout_ms, reduction=reduction, groups=groups))


def ring_of_one(lax_op, local_result):
    """A collective over one device: its local result, computed without binding the primitive.

    Under shard_map(check_vma=True) the result's type must drop the reduced
    axes, which only lax's collectives do; there lax's op runs (a collective
    over a group of one, as a lax user would pay).
    """
    return lax_op() if _jax_compat.checking_varying_axes() else local_result()


def _abstract_eval(x, *, params):
    kind, ranks = params.kind, params.ranks
    if kind.output_is_block and kind.ring_elements(x.shape[0], ranks) % ranks:
        raise ValueError(f"{kind.name} input of {x.shape[0]} elements is not a multiple of {ranks}")
    shape = (kind.out_elements(x.shape[0], ranks),)
    out = _jax_compat.with_shape_and_varying(x, shape, kinds.output_varying(x, kind, params.axis_name))
    # Typed as lax's: an untyped psum's result is never weakly typed (psum_p's abstract eval).
    if kind.invariant_output and not _jax_compat.checking_varying_axes():
        return out.update(weak_type=False)
    return out


def _rings(ctx, axis_name, groups):
    """The devices of every ring, [rings, ring size], each ring in axis order; with `groups` (lax's
    axis_index_groups), each axis' devices split into one ring per group, in the group's order."""
    mesh = _jax_compat.spmd_mesh(ctx)
    if mesh is None:
        raise ValueError(
            "jaxring collectives run inside jax.pmap or jax.shard_map; "
            f"axis {axis_name} is not bound by either here"
        )
    names = list(mesh.axis_names)
    for name in axis_name:
        if name not in names:
            raise ValueError(f"axis {name!r} is not an axis of the mesh {tuple(names)}")
    others = [n for n in names if n not in axis_name]
    order = [names.index(n) for n in others] + [names.index(n) for n in axis_name]
    ring = int(np.prod([mesh.shape[n] for n in axis_name]))
    rings = np.transpose(mesh.devices, order).reshape(-1, ring)
    if groups is not None:
        rings = rings[:, np.array(groups)].reshape(-1, len(groups[0]))
    return rings


def _lowering(ctx, x, *, params, platform):
    rings = _rings(ctx, params.axis_name, params.groups)
    if rings.shape[1] != params.ranks:
        raise ValueError(f"axis {params.axis_name} has {rings.shape[1]} devices in the mesh but {params.ranks} "
                         "when traced")
    if any(len({d.process_index for d in ring}) > 1 for ring in rings):
        if params.kind is not ALLREDUCE:
            through = functools.partial(_through_allreduce, params=params)
            return mlir.lower_fun(through, multiple_results=False)(ctx, x)
        return across_processes.lower_over_spanning_axis(ctx, x, rings, params.axis_name, params.timeout_ms,
                                                         params.reduction)
    return _ring_call.emit(ctx, x, kind=params.kind, ordinals=_ring_call.ordinals(rings), op_id=params.op_id,
                           timeout_ms=params.timeout_ms, in_place=params.in_place, platform=platform,
                           reduction=params.reduction)


def _through_allreduce(flat, *, params):
    """A reduce-scatter or all-gather over an axis that spans jax.distributed processes, where the MPI
    leg runs all-reduces only (across_processes.lower_over_spanning_axis): a reduce-scatter keeps its
    block of the all-reduce; an all-gather sums a buffer of `ranks` blocks in which each device wrote
    its own as unsigned integers, zeros elsewhere, so every bit arrives. About twice the bytes of a ring's."""
    ranks = params.ranks
    index = index_groups.position_in_own_group(params.axis_name, params.groups)
    allreduce = dataclasses.replace(params, kind=ALLREDUCE, op_id=_ring_call.next_op_id())
    if params.kind is REDUCE_SCATTER:
        block = flat.size // ranks
        return jax.lax.dynamic_slice_in_dim(ring_p.bind(flat, params=allreduce), index * block, block)
    bits, restore = _as_unsigned_bits(flat)
    buffer = jnp.zeros((ranks, bits.size), bits.dtype)
    buffer = jax.lax.dynamic_update_index_in_dim(buffer, bits, index, 0)
    return restore(ring_p.bind(buffer.reshape(-1), params=dataclasses.replace(allreduce, reduction="sum")))


def _as_unsigned_bits(flat):
    """`flat` (1-D) as unsigned integers holding its bits, and the function that turns a run of such
    buffers back into `flat`'s type (complex numbers as pairs of components, bools as bytes)."""
    dtype = flat.dtype
    if dtype == jnp.bool_:
        return flat.astype(jnp.uint8), lambda bits: bits.astype(jnp.bool_)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        parts, restore_parts = _as_unsigned_bits(jnp.stack([flat.real, flat.imag], -1).reshape(-1))
        return parts, lambda bits: jax.lax.complex(*jnp.moveaxis(restore_parts(bits).reshape(-1, 2), 1, 0))
    unsigned = jnp.dtype(f"uint{np.dtype(dtype).itemsize * 8}")
    return (jax.lax.bitcast_convert_type(flat, unsigned),
            lambda bits: jax.lax.bitcast_convert_type(bits, dtype))


def _not_differentiable(reduction, rule):
    """lax.pmax and lax.pmin have no derivative (jax 0.10.2 defines none): neither have jaxring's."""
    if reduction != "sum":
        raise NotImplementedError(
            f"{rule} rule for jaxring.allreduce(op={reduction!r}) not implemented, as lax's for 'p{reduction}' "
            f"is not; pass its input through jax.lax.stop_gradient where no derivative should flow"
        )


def _transpose(cotangent, x, *, params):
    _not_differentiable(params.reduction, "Transpose")
    if type(cotangent) is ad.Zero:
        return [ad.Zero(x.aval)]
    if params.kind.invariant_output and _jax_compat.checking_varying_axes():
        # Typed, the cotangent of a sum is the same on every device: each
        # input receives it whole, no communication (lax.psum's transpose).
        return [jax.lax.pcast(cotangent, params.axis_name, to="varying")]
    # Untyped, the cotangent may differ between devices, and the transpose of
    # a sum over devices is a sum over devices; reduce_scatter and all_gather
    # are each other's transpose.
    transposed = dataclasses.replace(params, kind=kinds.transpose_of(params.kind), op_id=_ring_call.next_op_id())
    return [ring_p.bind(cotangent, params=transposed)]


def _batch(axis_data, args, dims, *, params):
    (x,), (dim,) = args, dims
    if axis_data.name in params.axis_name:
        return _batch_over_the_vmap_axis(axis_data, x, dim, params)
    if dim is None:  # a value vmap does not batch (a constant): the op as it is, once
        return ring_p.bind(x, params=params), None
    # Lay the batch out so that each device's block holds its block of every
    # batch element: [B, N*c] -> [N, B, c] where the output is a block (reduce_scatter),
    # and back where the input is one (all_gather). Elementwise (all-reduce), any layout works.
    kind, ranks = params.kind, params.ranks
    x = jnp.moveaxis(x, dim, 0)
    batch, length = x.shape
    if kind.output_is_block:
        x = x.reshape(batch, ranks, length // ranks).transpose(1, 0, 2)
    out = ring_p.bind(x.reshape(-1), params=params)
    if kind.input_is_block:
        return out.reshape(ranks, batch, -1).transpose(1, 0, 2).reshape(batch, -1), 0
    return out.reshape(batch, -1), 0


def _batch_over_the_vmap_axis(axis_data, x, dim, params):
    """The op over a vmap axis (lax's batching of psum, psum_scatter, all_gather): the vmap axis'
    part is computed over the batch dimension inside the program, the device axes' part by the ring.

    `dim` None is a value the same for every batch element. The refusals (groups, a vmap axis
    with device axes in a gather or scatter) came at trace time (arguments.checked_axes)."""
    kind, names, size = params.kind, params.axis_name, axis_data.size
    devices = tuple(name for name in names if name != axis_data.name)
    if kind is ALLREDUCE:
        partial = _reduce_over_the_batch(x, dim, size, params.reduction)
        if not devices:
            return partial, None
        return ring_p.bind(partial, params=dataclasses.replace(params, axis_name=devices,
                                                               ranks=params.ranks // size)), None
    assert not devices and params.groups is None, (names, params.groups)
    if kind is ALL_GATHER:  # every batch element's buffer, in batch order: the gathered buffer
        return (jnp.tile(x, size) if dim is None else jnp.moveaxis(x, dim, 0).reshape(-1)), None
    # reduce_scatter: batch element b gets block b of the sum
    return _reduce_over_the_batch(x, dim, size, "sum").reshape(size, -1), 0


def _reduce_over_the_batch(x, dim, size, reduction):
    """`x` reduced over vmap's batch dimension `dim` as lax.psum / pmax / pmin reduce over a vmap axis:
    a value the same for every batch element (`dim` None) sums to `size` times itself."""
    if reduction != "sum":
        return x if dim is None else _BATCH_REDUCTIONS[reduction](x, axis=dim)
    accumulated = accumulation.accumulation_dtype(x.dtype)  # 16-bit floats summed in float32, as the ring does
    total = x.astype(accumulated) * size if dim is None else jnp.sum(x, axis=dim, dtype=accumulated)
    return total.astype(x.dtype)


_BATCH_REDUCTIONS = {"max": jnp.max, "min": jnp.min}


def _in_place(trace, operands, bound):
    """An op's output may take its input's buffer where the program computed the input; over the
    program's own input XLA would copy it first, which costs more than the fresh output it
    saves (docs/PERFORMANCE.md). Decided at each bind, from the operand bound there."""
    in_place = _jax_compat.is_computed_in(trace, operands[0])
    return {"params": dataclasses.replace(bound["params"], in_place=in_place)}


def _jvp(primals, tangents, *, params):
    _not_differentiable(params.reduction, "Differentiation")
    return _linear_jvp(primals, tangents, params=params)


_jax_compat.decide_params_at_every_bind(ring_p, _in_place)
ring_p.def_abstract_eval(_abstract_eval)
ad.deflinear2(ring_p, _transpose)
_linear_jvp = ad.primitive_jvps[ring_p]
ad.primitive_jvps[ring_p] = _jvp
batching.fancy_primitive_batchers[ring_p] = _batch
for _platform in ("cpu", "cuda"):
    mlir.register_lowering(ring_p, functools.partial(_lowering, platform=_platform), platform=_platform)
jax_tools.register(ring_p, kinds.invariant_p, kinds.retyped_p)
