"""The ring's XLA custom call over explicit rings of devices, for ring_primitive.py and the MPI path.

`emit` lowers one ring op to the handlers' custom call (jaxring/collectives/csrc); the
devices of each ring, in axis order, are a static attribute, so a handler learns its
rank without reading device memory. `device_rings_p` is the same op over rings given
as devices rather than a mesh axis: across_processes.py binds it while it lowers an allreduce
over an axis that spans jax.distributed processes, where each process runs its part of every ring.
"""

import functools
import itertools

import jax
import numpy as np
from jax.extend import core
from jax.interpreters import mlir

from jaxring.collectives import _ffi

# Stage size of the pipelined ring (per slice of a chunk), by platform.
SLICE_BYTES = {"cpu": 4 << 20, "cuda": 4 << 20}

# Every op gets its own id: the handlers of one op meet by it.
_op_ids = itertools.count(1)


def next_op_id() -> int:
    return next(_op_ids)


def device_ordinal(device) -> int:
    """What the handlers know `device` by (XLA's DeviceOrdinal): the CUDA ordinal on a GPU, else
    the device id (they differ in a multi-process jax.distributed run)."""
    return device.local_hardware_id if device.platform == "gpu" else device.id


def ordinals(rings):
    return np.vectorize(device_ordinal, otypes=[np.int64])(rings)


def workspace(dtype, elements, kind, platform):
    """The buffer the handler needs besides the output, in its accumulation type.

    The layout's one owner is the C++ side (WorkspaceFor in
    csrc/core/ring_handler_common.h); the handlers refuse any other size.
    """
    size, accumulation = _ffi.cpu_module().workspace(
        kind.mode, np.dtype(dtype).name, elements, SLICE_BYTES[platform], staging_slice=platform == "cuda"
    )
    return jax.core.ShapedArray((size,), np.dtype(accumulation))


def emit(ctx, x, *, kind, ordinals, op_id, timeout_ms, in_place, platform, reduction="sum"):
    """The custom call of one ring op over `ordinals` ([rings, ring size]: the devices' ordinals),
    reducing by `reduction` ("sum", "max", "min") where the kind reduces; its output takes its
    input's buffer where `in_place` and the CPU handler runs in place."""
    (x_aval,) = ctx.avals_in
    (out_aval,) = ctx.avals_out
    ring = ordinals.shape[1]
    full = kind.ring_elements(x_aval.shape[0], ring)
    workspace_aval = workspace(x_aval.dtype, full, kind, platform)
    in_place = in_place and platform == "cpu" and _ffi.cpu_module().runs_in_place(kind.mode, ring)
    lower = jax.ffi.ffi_lowering(_ffi.target_name(), operand_output_aliases={0: 0} if in_place else None)
    out, _ = lower(
        ctx.replace(avals_out=[out_aval, workspace_aval]),
        x,
        op_id=np.int64(op_id),
        mode=np.int64(kind.mode),
        elements=np.int64(full),
        ring_devices=ordinals.reshape(-1),
        ring_size=np.int64(ring),
        timeout_ms=np.int64(timeout_ms),
        slice_bytes=np.int64(SLICE_BYTES[platform]),
        reduction=np.int64(_ffi.reductions()[reduction]),
    )
    return [out]


# `rings`: the devices, a tuple of rings of this process' devices.
device_rings_p = core.Primitive("jaxring_device_rings")


def _device_rings_abstract_eval(x, *, kind, rings, timeout_ms, reduction="sum"):
    return jax.core.ShapedArray((kind.out_elements(x.shape[0], len(rings[0])),), x.dtype)


def _device_rings_lowering(ctx, x, *, kind, rings, timeout_ms, platform, reduction="sum"):
    return emit(ctx, x, kind=kind, ordinals=ordinals(np.array(rings, dtype=object)),
                op_id=next_op_id(), timeout_ms=timeout_ms, in_place=False, platform=platform, reduction=reduction)


device_rings_p.def_abstract_eval(_device_rings_abstract_eval)
for _platform in ("cpu", "cuda"):
    # Not cached: equal rings of one program would share the op id drawn here, and so their ring state.
    mlir.register_lowering(device_rings_p, functools.partial(_device_rings_lowering, platform=_platform),
                           platform=_platform, cacheable=False)

