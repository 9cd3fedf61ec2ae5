"""An all-reduce across MPI processes: the processes `processes=` names, and the local ops around mpi.py's leg.

mpi.reduce_over_processes reduces over this process' devices of a ring (a local reduce-scatter),
over the processes (the leg) and back (a local all-gather). Its callers differ only in the local
ops they hand it, each chosen here:
- allreduce(processes=...): jaxring's ring over the mapped axes (allreduce_over_processes);
- the lowering of an allreduce over a mesh axis that spans jax.distributed processes
  (ring_primitive.py): jaxring's ring over each process' own devices of each ring
  (lower_over_spanning_axis);
- tree_allreduce(local="lax"), the engine's train.allreduce "psum": lax's psum_scatter and
  all_gather (allreduce_with_lax_locally).

Importing mpi4py starts MPI, which `import jaxring` must not do: the ops reach mpi.py only through
this module, which imports it on first use (_mpi), for processes= other than False and for axes
that span processes.
"""

import functools

import jax
import numpy as np
from jax.interpreters import mlir

from jaxring.collectives import _ring_call, accumulation, arguments, index_groups
from jaxring.collectives.kinds import ALL_GATHER, REDUCE_SCATTER


def _mpi():
    """mpi.py, imported here on first use and by no op: it imports mpi4py, which starts MPI."""
    from jaxring.collectives import mpi

    return mpi


def communicator(processes):
    """The processes `processes=` names (mpi.Communicator), or None where it is this process alone."""
    if isinstance(processes, (bool, np.bool_)):
        processes = bool(processes)
    if processes is False:  # not `not processes`: MPI.COMM_NULL is falsy, and refused by mpi.communicator
        return None
    named = _mpi().communicator(processes)
    return named if named.size > 1 else None


def phase_over_processes(flat, mode: str, processes, wire_dtype=None):
    """mpi.phase_over_processes ("reduce_scatter" or "all_gather") over the processes `processes=` names,
    with the default timeout: the leg alone, for ShardedUpdate (sharded_update.py)."""
    named = communicator(processes)
    what = f"{mode} of {np.dtype(flat.dtype).name}[{flat.size}] over {named.size} processes (ShardedUpdate)"
    return _mpi().phase_over_processes(flat, mode, named, arguments.timeout_ms(None), what, wire_dtype)


def spans_processes(devices: int) -> bool:
    """Whether an axis of `devices` devices spans jax.distributed processes: more than this process' own,
    so a collective over it already crosses them (and processes= would cross them twice)."""
    return jax.process_count() > 1 and devices > jax.local_device_count()


def allreduce_over_processes(x, names, op, groups, communicator, timeout_ms, wire_dtype, bind_ring):
    """allreduce(processes=...)'s reduction of one leaf over several processes, a mean's sum (`op` is part of
    what every process must agree on, so a sum meeting a mean is refused): the local ring's reduce-scatter,
    the MPI leg over `communicator`'s processes (in `wire_dtype`: mpi.reduce_over_processes says where),
    the local ring's all-gather. With `groups`, each group's local rings run within it and
    the leg of a group's k-th device joins the k-th device of the same group in every process (every
    process runs the same groups); groups of different sizes go as rows (index_groups.in_rows_by_group).
    `bind_ring` is ring_primitive.bind, handed in because ring_primitive.py lowers through this module."""
    mpi = _mpi()
    devices = arguments.ring_size(names)
    if spans_processes(devices):
        raise ValueError(
            f"jaxring.allreduce(..., processes=...) over {names}: the axis has {devices} devices, more than "
            f"this process' {jax.local_device_count()}, so it spans jax.distributed processes and an allreduce "
            "over it already reduces over them. Drop processes=, or map the axis over jax.local_devices()."
        )

    reduction = "sum" if op == "mean" else op

    def over_processes(flat, ring_groups):
        if flat.size == 0:
            return flat
        what = (f"{op} of {np.dtype(x.dtype).name}{list(x.shape)} over {names}"
                f"{'' if groups is None else f' in groups {groups}'} x {communicator.size} processes")
        local_ops = mpi.LocalOps(
            len(ring_groups[0]) if ring_groups else devices,
            functools.partial(bind_ring, kind=REDUCE_SCATTER, names=names, timeout_ms=timeout_ms,
                              reduction=reduction, groups=ring_groups),
            functools.partial(bind_ring, kind=ALL_GATHER, names=names, timeout_ms=timeout_ms, groups=ring_groups),
        )
        return mpi.reduce_over_processes(flat, names, local_ops, timeout_ms, what, communicator, reduction, wire_dtype)

    if index_groups.sizes_differ(groups):
        return index_groups.in_rows_by_group(x, names, groups, reduction, lambda flat: over_processes(flat, None))
    return over_processes(x, groups)


def lower_over_spanning_axis(ctx, x, rings, axis_name, timeout_ms, reduction):
    """The lowering of jaxring.allreduce over a mesh axis that spans jax.distributed processes.

    `rings`: the devices of each ring of the axis ([rings, ring size]). Each
    process reduces its own devices of a ring with jaxring's ring, the MPI leg
    of each of them joins the processes, and the ring all-gathers: the
    computation of allreduce(processes=True) over those devices, so the same
    bits. mpi.own_devices_of_rings refuses a layout the leg cannot serve.
    """
    mpi = _mpi()
    parts = mpi.own_devices_of_rings(rings, axis_name)
    (aval,) = ctx.avals_in
    what = (f"{reduction} of {np.dtype(aval.dtype).name}[{aval.shape[0]}] over {axis_name} across "
            f"{mpi.processes()} processes")
    ring_op = functools.partial(_ring_call.device_rings_p.bind, rings=parts, timeout_ms=timeout_ms)
    local_ops = mpi.LocalOps(len(parts[0]), functools.partial(ring_op, kind=REDUCE_SCATTER, reduction=reduction),
                             functools.partial(ring_op, kind=ALL_GATHER))

    def reduce(flat):
        return mpi.reduce_over_processes(flat, (), local_ops, timeout_ms, what, reduction=reduction)

    return mlir.lower_fun(reduce, multiple_results=False)(ctx, x)


def allreduce_with_lax_locally(x, axis_name, op, processes, wire_dtype, timeout_ms):
    """The sum or mean (`op`) of `x` over the devices of `axis_name` by lax's collectives and, with
    `processes` (as allreduce's), over the processes it names by mpi.py's leg between lax's
    psum_scatter and all_gather, in `wire_dtype` (arguments.checked_wire_dtype's) for a float `x`;
    `timeout_ms` bounds the leg's waits (arguments.timeout_ms)."""
    named = communicator(processes)
    if named is None:
        return arguments.LAX_OPS[op](x, axis_name)
    mpi = _mpi()
    names = arguments.axis_names(axis_name)
    what = f"{op} of {np.dtype(x.dtype).name}{list(x.shape)} over {axis_name} x {named.size} processes, local lax"
    total = mpi.reduce_over_processes(x, names, mpi.lax_local_ops(names), timeout_ms, what, named,
                                      wire_dtype=wire_dtype)
    return accumulation.mean(total, arguments.ring_size(names) * named.size) if op == "mean" else total
