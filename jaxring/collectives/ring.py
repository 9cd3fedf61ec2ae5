"""The ring collectives as JAX ops, usable inside jit under pmap or shard_map.

Each op is one XLA custom call (jaxring/collectives/csrc): the handlers of the devices
along the mapped axis meet in a host-side rendezvous and run the ring of
docs/ARCHITECTURE.md. The devices of each ring, in axis order, are read from the mesh
when the op is lowered and passed as a static attribute, so a handler learns
its rank without reading device memory.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.sharding_impls import SPMDAxisContext
from jax.extend import core
from jax.interpreters import ad, batching, mlir

from jaxring.collectives import _ffi

ALLREDUCE, REDUCE_SCATTER, ALL_GATHER = 0, 1, 2
SUPPORTED_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32)
# Stage size of the pipelined ring (per slice of a chunk), by platform.
SLICE_BYTES = {"cpu": 4 << 20, "cuda": 4 << 20}

_op_ids = itertools.count(1)

ring_p = core.Primitive("jaxring_ring")


def _axis_names(axis_name):
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _ring_size(axis_name):
    size = 1
    for name in _axis_names(axis_name):
        size *= jax.lax.axis_size(name)
    return size


def _check_dtype(x):
    if not any(x.dtype == d for d in SUPPORTED_DTYPES):
        raise TypeError(
            f"jaxring collectives take float32, bfloat16, float16 or int32 arrays, "
            f"got {x.dtype}; cast the array first"
        )


def _timeout_ms(timeout):
    if timeout is None:
        return 0  # the handler's default (JAXRING_TIMEOUT_S, else 300 s)
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return max(1, int(round(timeout * 1000)))


def _ring(flat, *, mode, axis_name, timeout):
    """Binds one ring op on a 1-D array (padded by the caller where the mode needs it)."""
    _ffi.register()
    return ring_p.bind(
        flat,
        mode=mode,
        axis_name=_axis_names(axis_name),
        ranks=_ring_size(axis_name),
        op_id=next(_op_ids),
        timeout_ms=_timeout_ms(timeout),
    )


def allreduce(x, axis_name, op="sum", *, timeout=None):
    """Sum (or mean) of `x` over the devices of `axis_name`, on every device.

    Every device gets a bitwise identical result: each chunk is reduced once,
    by one rank, in one order. bfloat16 and float16 are accumulated in float32.
    """
    if op not in ("sum", "mean"):
        raise ValueError(f"op must be 'sum' or 'mean', got {op!r}")
    x = jnp.asarray(x)
    _check_dtype(x)
    if op == "mean" and x.dtype == jnp.int32:
        raise TypeError("op='mean' of an int32 array is not an int32; cast to float first")
    ranks = _ring_size(axis_name)
    if x.size == 0:
        return x
    total = _ring(x.reshape(-1), mode=ALLREDUCE, axis_name=axis_name, timeout=timeout)
    total = total.reshape(x.shape)
    if op == "mean":
        total = (total.astype(jnp.float32) / ranks).astype(x.dtype)
    return total


def reduce_scatter(x, axis_name, *, timeout=None):
    """The device's chunk of the sum of `x` over `axis_name`, by axis position.

    Returns a 1-D array of c = ceil(x.size / N) elements: the device at position
    r gets elements [r*c, (r+1)*c) of the flattened sum, zero-padded past x.size.
    """
    x = jnp.asarray(x)
    _check_dtype(x)
    ranks = _ring_size(axis_name)
    chunk = -(-x.size // ranks)
    flat = jnp.pad(x.reshape(-1), (0, chunk * ranks - x.size))
    if chunk == 0:
        return flat
    return _ring(flat, mode=REDUCE_SCATTER, axis_name=axis_name, timeout=timeout)


def all_gather(x, axis_name, *, timeout=None):
    """Concatenation, in axis order, of every device's 1-D `x`: the inverse of reduce_scatter.

    `all_gather(reduce_scatter(x, a), a)[:x.size].reshape(x.shape)` equals
    `allreduce(x, a)`.
    """
    x = jnp.asarray(x)
    _check_dtype(x)
    if x.ndim != 1:
        raise ValueError(f"all_gather takes the 1-D chunk reduce_scatter returns, got shape {x.shape}")
    if x.size == 0:
        return x
    return _ring(x, mode=ALL_GATHER, axis_name=axis_name, timeout=timeout)


# --- the primitive's rules -------------------------------------------------


def _out_elements(elements, mode, ranks):
    return {ALLREDUCE: elements, REDUCE_SCATTER: elements // ranks, ALL_GATHER: elements * ranks}[mode]


def _abstract_eval(x, *, mode, axis_name, ranks, op_id, timeout_ms):
    if mode == REDUCE_SCATTER and x.shape[0] % ranks:
        raise ValueError(f"reduce_scatter input of {x.shape[0]} elements is not a multiple of {ranks}")
    return jax.core.ShapedArray((_out_elements(x.shape[0], mode, ranks),), x.dtype)


def _accumulator_dtype(dtype):
    return np.dtype(np.int32) if dtype == jnp.int32 else np.dtype(np.float32)


def _workspace_elements(dtype, elements, mode):
    """Elements of partial sums the handler needs besides the output.

    All-reduce keeps its partial sums in the output when it has the
    accumulation type; reduce_scatter's output is one chunk, so its partial
    sums need a full buffer; all_gather adds nothing.
    """
    if mode == ALL_GATHER:
        return 0
    if mode == ALLREDUCE and np.dtype(dtype) == _accumulator_dtype(dtype):
        return 0
    return elements


def _device_ordinal(device, platform):
    # What the handler's DeviceOrdinal reports: the CUDA ordinal on GPU, the
    # device id on CPU (they differ in a multi-process jax.distributed run).
    return device.local_hardware_id if platform == "cuda" else device.id


def _ring_devices(ctx, axis_name, platform):
    """Device ordinals of every ring, group by group, each in axis order."""
    axis_context = ctx.module_context.axis_context
    if not isinstance(axis_context, SPMDAxisContext):
        raise ValueError(
            "jaxring collectives run inside jax.pmap or jax.shard_map over the devices "
            f"of this process; axis {axis_name} is not bound by either here"
        )
    mesh = axis_context.mesh
    names = list(mesh.axis_names)
    for name in axis_name:
        if name not in names:
            raise ValueError(f"axis {name!r} is not an axis of the mesh {tuple(names)}")
    others = [n for n in names if n not in axis_name]
    order = [names.index(n) for n in others] + [names.index(n) for n in axis_name]
    devices = np.transpose(mesh.devices, order)
    ring = int(np.prod([mesh.shape[n] for n in axis_name]))
    ordinals = np.vectorize(lambda d: _device_ordinal(d, platform), otypes=[np.int64])(devices)
    return ordinals.reshape(-1, ring).reshape(-1), ring


def _lowering(ctx, x, *, mode, axis_name, ranks, op_id, timeout_ms, platform):
    (x_aval,) = ctx.avals_in
    (out_aval,) = ctx.avals_out
    ring_devices, ring = _ring_devices(ctx, axis_name, platform)
    if ring != ranks:
        raise ValueError(f"axis {axis_name} has {ring} devices in the mesh but {ranks} when traced")
    full = x_aval.shape[0] * (ranks if mode == ALL_GATHER else 1)
    workspace_elements = _workspace_elements(x_aval.dtype, full, mode)
    if platform == "cuda":
        # One staging slice for peers that cannot map each other's memory.
        workspace_elements += SLICE_BYTES[platform] // np.dtype(x_aval.dtype).itemsize
    workspace = jax.core.ShapedArray((workspace_elements,), _accumulator_dtype(x_aval.dtype))
    lower = jax.ffi.ffi_lowering(_ffi.TARGET)
    out, _ = lower(
        ctx.replace(avals_out=[out_aval, workspace]),
        x,
        op_id=np.int64(op_id),
        mode=np.int64(mode),
        elements=np.int64(full),
        ring_devices=ring_devices,
        ring_size=np.int64(ring),
        timeout_ms=np.int64(timeout_ms),
        slice_bytes=np.int64(SLICE_BYTES[platform]),
    )
    return [out]


def _transpose(cotangent, x, *, mode, axis_name, ranks, op_id, timeout_ms):
    # In SPMD, the transpose of a sum over devices is a sum over devices, and
    # reduce_scatter and all_gather are each other's transpose.
    transposed_mode = {ALLREDUCE: ALLREDUCE, REDUCE_SCATTER: ALL_GATHER, ALL_GATHER: REDUCE_SCATTER}[mode]
    if type(cotangent) is ad.Zero:
        return [ad.Zero(x.aval)]
    return [
        ring_p.bind(
            cotangent,
            mode=transposed_mode,
            axis_name=axis_name,
            ranks=ranks,
            op_id=next(_op_ids),
            timeout_ms=timeout_ms,
        )
    ]


def _batch(axis_data, args, dims, *, mode, axis_name, ranks, op_id, timeout_ms):
    if axis_data.name in axis_name:
        raise ValueError(
            f"jaxring collectives reduce across devices; axis {axis_data.name!r} is a vmap "
            "axis, not a device axis. Map it with jax.pmap or jax.shard_map, or use jax.lax.psum"
        )
    # Lay the batch out so that each device's chunk holds its chunk of every
    # batch element: [B, N*c] -> [N, B, c] for reduce_scatter, and back for
    # all_gather. All-reduce is elementwise, so any layout works.
    (x,), (dim,) = args, dims
    x = jnp.moveaxis(x, dim, 0)
    batch, length = x.shape
    params = dict(mode=mode, axis_name=axis_name, ranks=ranks, op_id=op_id, timeout_ms=timeout_ms)
    if mode == REDUCE_SCATTER:
        x = x.reshape(batch, ranks, length // ranks).transpose(1, 0, 2)
        return ring_p.bind(x.reshape(-1), **params).reshape(batch, length // ranks), 0
    out = ring_p.bind(x.reshape(-1), **params)
    if mode == ALL_GATHER:
        return out.reshape(ranks, batch, length).transpose(1, 0, 2).reshape(batch, ranks * length), 0
    return out.reshape(batch, length), 0


ring_p.def_abstract_eval(_abstract_eval)
ad.deflinear2(ring_p, _transpose)
batching.fancy_primitive_batchers[ring_p] = _batch
mlir.register_lowering(ring_p, lambda ctx, x, **p: _lowering(ctx, x, platform="cpu", **p), platform="cpu")
mlir.register_lowering(ring_p, lambda ctx, x, **p: _lowering(ctx, x, platform="cuda", **p), platform="cuda")
