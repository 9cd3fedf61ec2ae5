"""Run by test_mpi.py under mpirun: jaxring under jax.distributed (JAX's own multi-process runtime).

jaxring.allreduce over a mesh axis that spans processes works as lax.psum
does there: the same sums as float64 numpy, and the same bits on every device
as allreduce(processes=True) over each process' own devices (which it
computes), with 500 chained steps queued as a training loop queues them.
axis_index_groups over it work where each group holds the same local devices
of every process or lies within one process, and where the groups differ in size.
reduce_scatter and all_gather over it run through the leg's all-reduce.
What it cannot serve is refused while compiling, at once, saying
what to do (never a wait for the timeout): processes=True over it (which
would sum over the processes twice), and a mesh or groups whose rings hold each process' devices in
different local orders, or not every process. JAX's process index must be the MPI rank.
"""

import pathlib
import socket
import sys
import time

from mpi4py import MPI

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jaxring

sys.path.insert(0, str(pathlib.Path(__file__).parents[4]))  # the repository root, for tests.*
from tests.jaxring.collectives import queued_loops, sharded_distributed  # noqa: E402
from tests.jaxring.collectives.leg_plans import plans_registered_by  # noqa: E402

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
# "swapped": JAX's process indices in the reverse of the MPI ranks, which jaxring must refuse.
swapped = sys.argv[1:] == ["swapped"]
if swapped:
    if rank == 0:
        with socket.socket() as s:  # a free port for the coordinator
            s.bind(("localhost", 0))
            port = s.getsockname()[1]
    else:
        port = None
    jax.distributed.initialize(f"localhost:{comm.bcast(port)}", num_processes=size, process_id=size - 1 - rank)
else:
    jaxring.initialize_jax_distributed(host="localhost")

L = jax.local_device_count()
mesh = Mesh(np.array(jax.devices()), ("x",))


def refused(f, *args):
    start = time.monotonic()
    try:
        f(*args)
    except ValueError as error:
        return str(error), time.monotonic() - start
    raise AssertionError("not refused")


if swapped:
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), np.ones((L, 3), np.float32))
    message, seconds = refused(jax.jit(jax.shard_map(lambda v: jaxring.allreduce(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P())), x)
    assert f"JAX process {size - 1 - rank} of {size} but MPI rank {rank}" in message and "process_id" in message, message
    assert seconds < 60, seconds
    print(f"PASS rank {rank} distributed-swapped", flush=True)
    sys.exit(0)
assert jax.process_index() == rank and jax.process_count() == size, (jax.process_index(), rank)
if sys.argv[1:] == ["failing"]:
    # Rank 1 fails while rank 0 waits in a leg for it: the job must end at once (abort.py), not after the
    # leg's timeout and JAX's shutdown barrier.
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), np.ones((L, 3), np.float32))
    step = jax.jit(jax.shard_map(lambda v: jaxring.allreduce(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P()))
    step(x).block_until_ready()
    if rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    step(x).block_until_ready()
    print(f"rank {rank} was not ended", flush=True)
    sys.exit(0)


def rows_of(process, n, dtype):
    """Process `process`'s rows, one per local device: random, odd-sized, never all zeros."""
    values = np.random.default_rng([7, process, n]).standard_normal((L, n))
    return (values * 100).astype(np.int32) if dtype == np.int32 else values.astype(dtype)


def over_the_global_axis(op, rows):
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), rows)
    f = jax.jit(jax.shard_map(lambda v: jaxring.allreduce(v, "x", op), mesh=mesh, in_specs=P("x"), out_specs=P()))
    return np.asarray(f(x).addressable_shards[0].data)[0]


def with_processes_true(op, rows):
    out = jax.pmap(lambda v: jaxring.allreduce(v, "i", op, processes=True), "i", devices=jax.local_devices())(rows)
    return np.asarray(out)


# Works over an axis that spans every process, every dtype, odd sizes and
# sizes below the number of devices.
for dtype in (np.float32, jnp.bfloat16, np.float16, np.int32):
    for n in (1, 3, 1000):
        for op in ("sum", "mean"):
            if op == "mean" and dtype == np.int32:
                continue
            got = over_the_global_axis(op, rows_of(rank, n, dtype))
            reference = with_processes_true(op, rows_of(rank, n, dtype))
            assert all((row.view(np.uint8) == got.view(np.uint8)).all() for row in reference), (dtype, n, op)
            exact = sum(rows_of(p, n, dtype).astype(np.float64).sum(0) for p in range(size))
            exact = exact / (size * L) if op == "mean" else exact
            tolerance = {np.float32: 1e-5, np.int32: 0}.get(dtype, 2e-2)
            np.testing.assert_allclose(got.astype(np.float64), exact, rtol=tolerance, atol=tolerance)
# max and min, process 0's float values with NaNs mixed in, against processes=True bitwise and numpy
# exactly (lax's CPU rule, core/reduction.h: a NaN is skipped where another value exists).
for dtype in (np.float32, np.int8, np.uint16):
    for n in (1, 7, 2049):
        for op in ("max", "min"):
            rows = rows_of(rank, n, np.float32)
            if dtype == np.float32 and rank == 0:
                rows[:, ::5] = np.nan
            rows = rows.astype(dtype) if dtype == np.float32 else (rows * 40).astype(np.int64).astype(dtype)
            got = over_the_global_axis(op, rows)
            reference = with_processes_true(op, rows)
            assert all((row.view(np.uint8) == got.view(np.uint8)).all() for row in reference), (dtype, n, op)
            every_row = np.concatenate([rows_of(p, n, np.float32) for p in range(size)])
            if dtype == np.float32:
                every_row[:L, ::5] = np.nan
                exact = (np.nanmax if op == "max" else np.nanmin)(every_row, axis=0)
            else:
                every_row = (every_row * 40).astype(np.int64).astype(dtype)
                exact = (np.max if op == "max" else np.min)(every_row, axis=0)
            np.testing.assert_array_equal(got, exact.astype(dtype), err_msg=f"{op} of {np.dtype(dtype).name}[{n}]")
print(f"rank {rank}: allreduce over the global axis matches numpy and processes=True bitwise", flush=True)

# A 2-D global mesh: over the process axis alone (rings of one device per
# process) and over both axes, against float64 numpy.
grid = Mesh(np.array(jax.devices()).reshape(size, L), ("p", "l"))
mine = np.random.default_rng([8, rank]).standard_normal((1, L, 4)).astype(np.float32)
every = [np.random.default_rng([8, p]).standard_normal((1, L, 4)).astype(np.float64) for p in range(size)]
blocks = jax.make_array_from_process_local_data(NamedSharding(grid, P("p", "l")), mine)
position = {d: index for index, d in np.ndenumerate(grid.devices)}
expectations = {  # axes: (out_specs, expected block of the device at (p, l))
    "p": (P(None, "l"), lambda p, l: sum(e[0, l] for e in every)),
    ("p", "l"): (P(), lambda p, l: sum(e[0].sum(0) for e in every)),
    "l": (P("p"), lambda p, l: every[p][0].sum(0)),
}
for axes, (out_spec, expected) in expectations.items():
    f = jax.jit(jax.shard_map(lambda v, a=axes: jaxring.allreduce(v, a), mesh=grid, in_specs=P("p", "l"), out_specs=out_spec))
    for shard in f(blocks).addressable_shards:
        np.testing.assert_allclose(np.asarray(shard.data).reshape(4), expected(*position[shard.device]), rtol=1e-5, atol=1e-5)
print(f"rank {rank}: 2-D mesh over the process axis and over both", flush=True)

# axis_index_groups over the global axis (shard_map unchecked, as lax.psum takes groups): groups
# holding the same local device of every process (a ring per group), groups within one process (local
# rings), and groups of different sizes (rows of the whole axis), against float64 numpy.
S = size * L


def own_group(index, groups):
    """The devices of global index `index`'s group: the whole axis where `groups` is None."""
    return list(range(S)) if groups is None else next(g for g in groups if index in g)


ACROSS = [[p * L + l for p in range(size)] for l in range(L)]
WITHIN = [list(range(p * L, (p + 1) * L)) for p in range(size)]
for groups in [ACROSS, WITHIN] + ([[[0], list(range(1, S))]] if S > 2 else []):
    for op in ("sum", "mean", "max"):
        rows = rows_of(rank, 257, np.float32)
        grouped = jax.jit(jax.shard_map(lambda v, g=groups, o=op: jaxring.allreduce(v, "x", o, axis_index_groups=g),
                                        mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
        out = grouped(jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), rows))
        every_row = np.concatenate([rows_of(p, 257, np.float32) for p in range(size)]).astype(np.float64)
        for shard in out.addressable_shards:
            index = shard.index[0].start
            group = own_group(index, groups)
            exact = getattr(every_row[group], op)(0)  # numpy's sum, mean or max over the group's rows
            np.testing.assert_allclose(np.asarray(shard.data)[0], exact, rtol=1e-5, atol=1e-5,
                                       err_msg=f"{op} within {groups}, device {index}")
if L == 2 and size == 3:  # rings over processes 0 and 1, and one within process 2: refused
    partial = [[0, 2], [1, 3], [4, 5]]
    alone = jax.jit(jax.shard_map(lambda v: jaxring.allreduce(v, "x", axis_index_groups=partial), mesh=mesh,
                                  in_specs=P("x"), out_specs=P("x"), check_vma=False))
    message, seconds = refused(alone, jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")),
                                                                             rows_of(rank, 5, np.float32)))
    assert "every process in every ring" in message and "axis_index_groups is a ring" in message, message
    assert seconds < 60, seconds
print(f"rank {rank}: axis_index_groups over the global axis", flush=True)

# Equal all-reduces of one program: JAX lowers equal equations once unless told
# not to, and these would then share their rings' op id and their leg's MPI tag,
# and could take each other's data. Four legs of one shape, other values each.
legs = [rows_of(rank, 1001, np.float32) * np.float32(i + 1) for i in range(4)]
equal = jax.jit(jax.shard_map(lambda *vs: tuple(jaxring.allreduce(v, "x") for v in vs), mesh=mesh,
                              in_specs=(P("x"),) * 4, out_specs=(P(),) * 4))
leg_inputs = [jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), leg) for leg in legs]
lowered = []
tags = [plan["tag"] for plan in plans_registered_by(lambda: lowered.append(equal.lower(*leg_inputs).as_text()))]
text = lowered[0]
op_ids = [line.split("op_id = ")[1].split(" ")[0] for line in text.splitlines() if "op_id = " in line]
assert len(tags) == len(set(tags)) == 4, tags
assert len(op_ids) == len(set(op_ids)) == (0 if L == 1 else 8), op_ids  # a reduce-scatter and an all-gather per leg
exact = [sum((rows_of(p, 1001, np.float32) * np.float32(i + 1)).astype(np.float64).sum(0) for p in range(size))
         for i in range(4)]
for _ in range(30):
    for i, out in enumerate(equal(*leg_inputs)):
        np.testing.assert_allclose(np.asarray(out.addressable_shards[0].data)[0], exact[i], rtol=1e-5, atol=1e-5)
print(f"rank {rank}: equal all-reduces of one program, each its own tag and op ids", flush=True)


# Steps queued as a training loop queues them (queued_loops.py): chained, donated, values per step,
# over the axis that spans every process, each step's mean and the final parameters against float64.
steps = 500
every = [queued_loops.rows(p, L) for p in range(size)]
w0 = np.cos(np.arange(queued_loops.SIZE, dtype=np.float32))
expected_means, expected_w = queued_loops.replay(np.concatenate(every), steps, w0)
replicated = NamedSharding(mesh, P())
step = queued_loops.shard_mapped(jax.devices())
w = jax.make_array_from_process_local_data(replicated, w0)
x_rows = jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), every[rank])
scales = [jax.make_array_from_process_local_data(replicated, queued_loops.scale(k)) for k in range(5)]
w, means = queued_loops.queue(step, w, x_rows, steps, lambda k: scales[k % 5])
queued_loops.check("jax.distributed, queued", means, w, expected_means, expected_w,
                   lambda a: np.asarray(a.addressable_shards[0].data))
print(f"rank {rank}: {steps} queued steps over the global axis", flush=True)

# reduce_scatter and all_gather over the global axis (through the leg's all-reduce), whole and within
# groups: each scattered block is the all-reduce's, bit for bit, and float64 numpy's within a rounding;
# the gather moves every bit (NaN, -0.0, inf) of float32, int8, complex64 and bool; and the gather's
# gradient (its transpose, a reduce-scatter) is each device's column of the cotangents summed.
def unchecked(f, out_specs=P("x")):
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=out_specs, check_vma=False))


def global_rows(rows):
    return jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), rows)


def special_rows(p, dtype):
    """Process `p`'s rows of `dtype` for the gather, holding NaN, -0.0, inf and 0.0 where a float can."""
    values = rows_of(p, 5, np.float32)
    values[:, :4] = [np.nan, -0.0, np.inf, 0.0]
    if dtype == np.complex64:
        return (values + 1j * values[:, ::-1]).astype(dtype)
    if dtype == np.bool_:
        return values > 0
    return values.astype(dtype) if dtype == np.float32 else np.nan_to_num(values * 20).astype(dtype)


for groups in (None, ACROSS):
    ring = S if groups is None else size
    rows = rows_of(rank, 3 * ring, np.float32)
    scattered = unchecked(lambda v, g=groups: jaxring.reduce_scatter(v[0], "x", tiled=True, axis_index_groups=g)[None])
    summed = unchecked(lambda v, g=groups: jaxring.allreduce(v[0], "x", axis_index_groups=g)[None])
    got, whole = scattered(global_rows(rows)), summed(global_rows(rows))
    every_row = np.concatenate([rows_of(p, 3 * ring, np.float32) for p in range(size)]).astype(np.float64)
    for shard, total in zip(got.addressable_shards, whole.addressable_shards):
        index = shard.index[0].start
        group = own_group(index, groups)
        position = group.index(index)
        block = np.asarray(shard.data)[0]
        assert block.tobytes() == np.asarray(total.data)[0, 3 * position:3 * position + 3].tobytes(), (groups, index)
        np.testing.assert_allclose(block, every_row[group].sum(0)[3 * position:3 * position + 3], rtol=1e-5,
                                   atol=1e-5, err_msg=f"reduce_scatter within {groups}, device {index}")
    for dtype in (np.float32, np.int8, np.complex64, np.bool_):
        gathered = unchecked(lambda v, g=groups: jaxring.all_gather(v[0], "x", axis_index_groups=g)[None])(
            global_rows(special_rows(rank, dtype)))
        every_row = np.concatenate([special_rows(p, dtype) for p in range(size)])
        for shard in gathered.addressable_shards:
            index = shard.index[0].start
            group = own_group(index, groups)
            want = every_row[group]
            assert np.asarray(shard.data)[0].tobytes() == want.tobytes(), (np.dtype(dtype).name, groups, index)
gather_whole = unchecked(lambda v: jaxring.all_gather(v[0], "x")[None])
weights = np.random.default_rng(9).standard_normal((S, 7))
loss = lambda v: jnp.sum(gather_whole(v) * (1 + jnp.arange(S, dtype=jnp.float32))[:, None, None] * weights)
gradient = jax.jit(jax.grad(loss))(global_rows(rows_of(rank, 7, np.float32)))
for shard in gradient.addressable_shards:
    index = shard.index[0].start
    np.testing.assert_allclose(np.asarray(shard.data)[0], weights[index] * S * (S + 1) / 2, rtol=1e-5,
                               err_msg=f"all_gather's gradient, device {index}")
print(f"rank {rank}: reduce_scatter and all_gather over the global axis", flush=True)

if L > 1:  # one layout suffices: its compilation is the costly part
    sharded_distributed.check(mesh, comm)
    print(f"rank {rank}: ShardedUpdate under shard_map (check_vma) over the global axis", flush=True)

# What the leg cannot serve is refused while compiling, far below any timeout.
if L > 1:
    # Each process' devices in another local order: the k-th chunk would meet another device's chunk.
    order = [d for p in range(size) for d in (jax.local_devices(process_index=p)[::-1] if p % 2 else jax.local_devices(process_index=p))]
    mixed = Mesh(np.array(order), ("x",))
    y = jax.make_array_from_process_local_data(NamedSharding(mixed, P("x")), rows_of(rank, 5, np.float32))
    message, seconds = refused(jax.jit(jax.shard_map(lambda v: jaxring.allreduce(v, "x"), mesh=mixed, in_specs=P("x"), out_specs=P())), y)
    assert "same local order" in message and "jax.lax.psum" in message, message
    assert seconds < 60, seconds
twice = jax.jit(jax.shard_map(lambda v: jaxring.allreduce(v, "x", processes=True), mesh=mesh, in_specs=P("x"), out_specs=P()))
message, seconds = refused(twice, jax.make_array_from_process_local_data(NamedSharding(mesh, P("x")), rows_of(rank, 5, np.float32)))
assert "already reduces over them" in message and "Drop processes=" in message, message
# Outside shard_map a jit program's arrays are global: no value is one process' own.
message, seconds = refused(jax.jit(lambda v: jaxring.allreduce(v, (), processes=True)), rows_of(rank, 5, np.float32))
assert "under jax.distributed" in message and "jax.shard_map" in message, message
print(f"rank {rank}: refusals at compile time", flush=True)
print(f"PASS rank {rank} distributed", flush=True)
