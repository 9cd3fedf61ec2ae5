"""Run by test_mpi.py under `mpirun -np P python -m mpi4py`, each rank seeing K host devices.

Every check either passes on every rank or raises, and `python -m mpi4py`
turns an uncaught exception into MPI_Abort, so the job never hangs. Each rank
prints "PASS <check>" per check; test_mpi.py counts them.
"""

import hashlib
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from mpi4py import MPI

import jaxring
from jaxring.collectives import global_ops, mpi, replicas, topology
from jaxring.engine import sync as sync_lib
from jaxring.engine.task import AXIS as AXIS_SYNC

sys.path.insert(0, str(pathlib.Path(__file__).parents[4]))  # the repository root, for tests.*
from tests.jaxring.collectives.leg_plans import plans_registered_by  # noqa: E402
from tests.jaxring.collectives.operand_kinds import BLOCK, OPERANDS  # noqa: E402

SEED = 20261121
SHAPES = [(1,), (2,), (7,), (129,), (5, 33)]  # tiny, below the device counts, odd
DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32]
AXIS = "i"

world = topology.init()
comm = MPI.COMM_WORLD
L = len(world.local_devices)


def passed(check):
    print(f"PASS rank {world.rank} {check}", flush=True)


def data(rank, case, shape, dtype):
    """Rank `rank`'s input for `case` (one row per local device): any rank can rebuild any other's.

    16-bit floats lie in +-[0.5, 4), so that float32 sums of up to 9 of them are
    exact and the float32-accumulated result is the exact sum rounded once.
    """
    rng = np.random.default_rng([SEED, rank, case])
    if dtype == jnp.int32:
        return rng.integers(-(2**20), 2**20, (L, *shape)).astype(np.int32)
    if dtype == jnp.float32:
        return rng.standard_normal((L, *shape)).astype(np.float32)
    return (rng.choice([-1, 1], (L, *shape)) * rng.uniform(0.5, 4, (L, *shape))).astype(dtype)


def reference(case, shape, dtype):
    """float64 sum over every device of every process, and the sum of magnitudes (for error bounds)."""
    inputs = [data(r, case, shape, dtype).astype(np.float64) for r in range(world.size)]
    return sum(x.sum(0) for x in inputs), sum(np.abs(x).sum(0) for x in inputs)


def same_everywhere(out):
    """Every row of every process holds the same bits."""
    rows = np.asarray(out)
    digest = hashlib.blake2b(rows[0].tobytes()).hexdigest()
    return all(row.tobytes() == rows[0].tobytes() for row in rows) and len(set(comm.allgather(digest))) == 1


def cases():
    return {f"{np.dtype(d).name}{list(s)}": (i, s, d) for i, (s, d) in enumerate((s, d) for s in SHAPES for d in DTYPES)}


def assert_sum(name, out, case, shape, dtype):
    want, magnitude = reference(case, shape, dtype)
    got = np.asarray(out)
    assert got.shape == (L, *shape) and got.dtype == np.dtype(dtype), (name, got.shape, got.dtype)
    assert same_everywhere(out), name
    if dtype == jnp.float32:  # at most one rounding per term
        tolerance = world.n_devices * float(jnp.finfo(dtype).eps) * magnitude
        assert (np.abs(got.astype(np.float64) - want) <= tolerance).all(), name
    else:  # int32 exact; 16-bit floats: the exact sum rounded once (float32 accumulation)
        exact = np.broadcast_to(want.astype(dtype), got.shape)
        assert got.tobytes() == exact.tobytes(), (name, np.abs(got.astype(np.float64) - want).max())


def check_topology():
    assert world.rank == comm.Get_rank() and world.size == comm.Get_size()
    # mpirun started every rank on this one node.
    assert (world.local_rank, world.local_size) == (world.rank, world.size)
    assert world.local_devices == tuple(jax.local_devices())
    assert world.n_devices == world.size * L
    passed("topology")


def check_allreduce():
    """Every dtype and shape as one pytree, one compiled pmap: many legs in flight at once."""
    tree = {name: data(world.rank, case, shape, dtype) for name, (case, shape, dtype) in cases().items()}
    step = jax.pmap(lambda t: jaxring.allreduce(t, AXIS, processes=True), AXIS)
    out = step(tree)
    for name, (case, shape, dtype) in cases().items():
        assert_sum(name, out[name], case, shape, dtype)
    again = step(tree)  # the compiled program runs again: no agreement, the same bits
    assert all(np.asarray(again[k]).tobytes() == np.asarray(out[k]).tobytes() for k in tree)
    passed("allreduce")


def check_algorithms():
    """Both algorithms of the leg (csrc/mpi/mpi_host_ring.cc), either side of the threshold, against float64 numpy.

    One-shot, the ring in one piece per step, the ring in 3-element pieces
    (empty ones too), and the defaults just below and just above
    mpi.ONE_SHOT_MAX_BYTES (a device's chunk of the float32 buffer).
    """
    defaults = mpi.ONE_SHOT_MAX_BYTES, mpi.PIECE_BYTES
    edge = mpi.ONE_SHOT_MAX_BYTES // 4 * L
    settings = {"one-shot": (1 << 40, defaults[1]), "ring whole": (0, 1 << 40), "ring pieces": (0, 12)}
    try:
        for algorithm, (mpi.ONE_SHOT_MAX_BYTES, mpi.PIECE_BYTES) in settings.items():
            tree = {name: data(world.rank, case, shape, dtype) for name, (case, shape, dtype) in cases().items()}
            tree = {**tree, "odd": data(world.rank, 900, (3, 331), jnp.float32)}
            out = jax.pmap(lambda t: jaxring.allreduce(t, AXIS, processes=True), AXIS)(tree)
            for name, (case, shape, dtype) in {**cases(), "odd": (900, (3, 331), jnp.float32)}.items():
                assert_sum(f"{algorithm} {name}", out[name], case, shape, dtype)
        mpi.ONE_SHOT_MAX_BYTES, mpi.PIECE_BYTES = defaults
        for case, (size, dtype) in enumerate([(edge, jnp.float32), (edge + 1, jnp.bfloat16), (edge + L + 5, jnp.int32)]):
            x = data(world.rank, 950 + case, (size,), dtype)
            out = jax.pmap(lambda v: jaxring.allreduce(v, AXIS, processes=True), AXIS)(x)
            assert_sum(f"default {size}", out, 950 + case, (size,), dtype)
    finally:
        mpi.ONE_SHOT_MAX_BYTES, mpi.PIECE_BYTES = defaults
    passed("algorithms")


def check_mean_and_jit_and_shard_map():
    shape, dtype, case = (3, 50), jnp.float32, 100
    x = data(world.rank, case, shape, dtype)
    want, magnitude = reference(case, shape, dtype)
    tolerance = world.n_devices * float(jnp.finfo(dtype).eps) * magnitude / world.n_devices
    mean = jax.jit(jax.pmap(lambda v: jaxring.allreduce(v, AXIS, "mean", processes=True), AXIS))(x)
    assert (np.abs(np.asarray(mean, np.float64) - want / world.n_devices) <= tolerance).all()
    mesh = Mesh(np.array(world.local_devices), (AXIS,))
    mapped = jax.jit(jax.shard_map(lambda v: jaxring.allreduce(v[0], AXIS, "mean", processes=True)[None],
                                   mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS), check_vma=False))
    assert np.asarray(mapped(x)).tobytes() == np.asarray(mean).tobytes()
    typed = jax.jit(jax.shard_map(lambda v: jaxring.allreduce(v[0], AXIS, "mean", processes=True),
                                  mesh=mesh, in_specs=P(AXIS), out_specs=P(), check_vma=True))
    assert np.asarray(typed(x)).tobytes() == np.asarray(mean)[0].tobytes()  # typed invariant, as lax.pmean
    ints = data(world.rank, 101, (6,), jnp.int32)
    int_mean = jax.pmap(lambda v: jaxring.allreduce(v, AXIS, "mean", processes=True), AXIS)(ints)
    assert int_mean.dtype == np.float32  # as lax.pmean
    np.testing.assert_allclose(np.asarray(int_mean)[0], reference(101, (6,), jnp.int32)[0] / world.n_devices, rtol=1e-6)
    assert np.asarray(global_ops.global_allreduce(x, "mean")).tobytes() == np.asarray(mean).tobytes()
    passed("mean_and_jit_and_shard_map")


def check_sync():
    """The trainer's sync averages (not sums) over every device of every process, both methods."""
    rng = np.random.default_rng([SEED, world.rank, 500])
    tree = {"w": rng.standard_normal((L, 5, 3)).astype(np.float32), "b": rng.standard_normal((L, 7)).astype(np.float32),
            "h": rng.standard_normal((L, 9)).astype(jnp.bfloat16)}
    every = [np.random.default_rng([SEED, r, 500]) for r in range(world.size)]
    every = [{"w": g.standard_normal((L, 5, 3)).astype(np.float32), "b": g.standard_normal((L, 7)).astype(np.float32),
              "h": g.standard_normal((L, 9)).astype(jnp.bfloat16)} for g in every]
    for method in ("ring", "psum"):
        out = jax.pmap(sync_lib.make_sync(world.size, method, bucket_bytes=64).mean, AXIS_SYNC)(tree)
        for key in tree:
            want = np.mean([t[key].astype(np.float64) for t in every], axis=(0, 1))
            tolerance = 2e-2 if key == "h" else 1e-5
            np.testing.assert_allclose(np.asarray(out[key], np.float64), np.broadcast_to(want, out[key].shape),
                                       rtol=tolerance, atol=tolerance, err_msg=f"{method} {key}")
            assert same_everywhere(out[key]), (method, key)
    passed("sync")


def check_tree_wire_dtype():
    """tree_allreduce(wire_dtype=...) is allreduce(wire_dtype=...) leaf by leaf, bit for bit, where each
    leaf is a bucket of its own; fused, every bucket's leg crosses in the wire dtype too."""
    tree = {name: data(world.rank, case, shape, dtype) for name, (case, shape, dtype) in cases().items()}
    for op, wire in (("sum", "bfloat16"), ("mean", "float16")):
        leafwise = jax.pmap(lambda t: jaxring.tree_allreduce(t, AXIS, op, bucket_bytes=1, processes=True,
                                                             wire_dtype=wire), AXIS)(tree)
        alone = jax.pmap(lambda t: {k: jaxring.allreduce(v, AXIS, op, processes=True, wire_dtype=wire)
                                    for k, v in t.items()}, AXIS)(tree)
        for name in tree:
            assert np.asarray(leafwise[name]).tobytes() == np.asarray(alone[name]).tobytes(), (op, wire, name)
        floats = {k: v for k, v in tree.items() if np.dtype(v.dtype) == np.float32}
        fused = jax.pmap(lambda t: jaxring.tree_allreduce(t, AXIS, op, bucket_bytes=1 << 20, processes=True,
                                                          wire_dtype=wire), AXIS)
        legs = [line for line in fused.lower(floats).as_text().splitlines() if "jaxring_mpi_ring" in line]
        short = "bf16" if wire == "bfloat16" else "f16"
        assert len(legs) == 1 and f"x{short}>" in legs[0], (op, wire, legs)  # one bucket, crossing in 16 bits
    passed("tree_wire_dtype")


def check_mismatch():
    odd_one = world.size - 1
    length = 11 if world.rank == odd_one else 10
    try:
        jax.pmap(lambda v: jaxring.allreduce(v, AXIS, processes=True), AXIS)(np.ones((L, length), np.float32))
    except ValueError as error:
        message = str(error)
    else:
        raise AssertionError("mismatched shapes were not detected")
    assert f"rank {odd_one}: leg" in message and "float32[11]" in message and "float32[10]" in message, message
    op = "mean" if world.rank == odd_one else "sum"
    try:
        jax.pmap(lambda v: jaxring.allreduce(v, AXIS, op, processes=True), AXIS)(np.ones((L, 10), np.float32))
    except ValueError as error:
        assert f"rank {odd_one}: leg" in str(error) and "mean of float32[10]" in str(error), error
    else:
        raise AssertionError("mismatched ops were not detected")
    defaults = mpi.ONE_SHOT_MAX_BYTES
    mpi.ONE_SHOT_MAX_BYTES = 0 if world.rank == odd_one else defaults
    try:
        jax.pmap(lambda v: jaxring.allreduce(v, AXIS, processes=True), AXIS)(np.ones((L, 10), np.float32))
    except ValueError as error:
        assert f"rank {odd_one}: leg" in str(error) and "ring of" in str(error) and "one-shot" in str(error), error
    else:
        raise AssertionError("mismatched algorithms were not detected")
    finally:
        mpi.ONE_SHOT_MAX_BYTES = defaults
    # The mismatch is found when compiling, before any data moves, so the processes stay in step.
    out = jax.pmap(lambda v: jaxring.allreduce(v, AXIS, processes=True), AXIS)(np.ones((L, 4), np.float32))
    assert (np.asarray(out) == world.n_devices).all()
    passed("mismatch")


def rank_tree(rank):
    rng = np.random.default_rng([SEED, rank, 200])
    stacked = np.repeat(rng.standard_normal((1, 5)).astype(jnp.bfloat16), L, axis=0)
    return {
        "dense": {"kernel": rng.standard_normal((3, 4)).astype(np.float32), "steps": np.int32(rank)},
        # One row per local device, laid out as pmap returns it.
        "stacked": jax.device_put(stacked, NamedSharding(Mesh(world.local_devices, ("d",)), P("d"))),
        "scalar": jax.device_put(np.float32(rank), world.local_devices[-1]),
    }


def check_broadcast_and_replicas():
    root = world.size - 1
    mine = rank_tree(world.rank)
    got = replicas.broadcast(mine, root=root)
    want = rank_tree(root)
    for path, leaf in jax.tree_util.tree_leaves_with_path(got):
        expected = dict(jax.tree_util.tree_leaves_with_path(want))[path]
        assert np.asarray(leaf).tobytes() == np.asarray(expected).tobytes(), path
    assert got["stacked"].sharding == mine["stacked"].sharding
    assert got["scalar"].sharding == mine["scalar"].sharding
    replicas.check_replicas(got)

    # One device row drifts on one process.
    drifting = world.size - 1
    if world.rank == drifting:
        rows = [s.data for s in got["stacked"].addressable_shards]
        rows[-1] = rows[-1] + jnp.bfloat16(1)
        got["stacked"] = jax.make_array_from_single_device_arrays(
            got["stacked"].shape, got["stacked"].sharding, rows
        )
    assert not replicas.replicas_consistent(got)
    try:
        replicas.check_replicas(got)
    except replicas.ReplicasDivergedError as error:
        message = str(error)
    else:
        raise AssertionError("divergent replicas were not reported")
    assert f"['stacked']: rank {drifting} device {world.local_devices[-1].id} differ" in message, message
    passed("broadcast_and_replicas")


def check_host_leaf_divergence():
    tree = {"w": np.arange(6, dtype=np.float32) + (world.rank == 0)}
    if world.size > 1:
        assert not replicas.replicas_consistent(tree)
    assert replicas.replicas_consistent({"w": np.arange(6, dtype=np.float32)})
    passed("host_leaf_divergence")


def check_equal_legs():
    """Independent all-reduces of one shape in one program, each with a tag of its own, sum right.

    JAX lowers equal equations of a program once unless told not to; legs
    that shared a tag could take each other's messages (found when each leg
    also began to wait for its peers' farewells: a data message landed in a
    farewell's empty receive). Both algorithms, four legs, 30 runs.
    """
    shapes = {"one-shot": (5,), "ring": (mpi.ONE_SHOT_MAX_BYTES // 4 * L + 3,)}
    for algorithm, shape in shapes.items():
        inputs = [data(world.rank, 960 + i, shape, jnp.float32) for i in range(4)]
        program = jax.pmap(lambda *xs: [jaxring.allreduce(x, AXIS, processes=True) for x in xs], AXIS)
        tags = [plan["tag"] for plan in plans_registered_by(lambda: program.lower(*inputs))]
        assert len(tags) == len(set(tags)) == len(inputs), (algorithm, tags)
        for _ in range(30):
            for i, out in enumerate(program(*inputs)):
                assert_sum(f"{algorithm} leg {i}", out, 960 + i, shape, jnp.float32)
    passed("equal_legs")


def check_queued():
    """500 chained steps of allreduce(processes=True), all queued before the first is read, values per
    step, against a float64 replay over every process' rows (queued_loops.py)."""
    from tests.jaxring.collectives import queued_loops

    steps = 500
    every = [queued_loops.rows(p, L) for p in range(world.size)]
    w0 = np.cos(np.arange(queued_loops.SIZE, dtype=np.float32))
    expected_means, expected_w = queued_loops.replay(np.concatenate(every), steps, w0)
    step = queued_loops.pmapped(world.local_devices, processes=True)
    w, means = queued_loops.queue(step, np.stack([w0] * L), every[world.rank], steps,
                                  lambda k: np.full((L,), queued_loops.scale(k)))
    queued_loops.check("processes=True, queued", means, w, expected_means, expected_w)
    passed("queued")


def check_operand_kinds():
    """allreduce(processes=True), sum and mean, and tree_allreduce over every kind of operand lax.psum
    takes (operand_kinds.py), in one program: lax.psum's and pmean's dtypes, and the float64 sum over
    every device of every process."""
    x = data(world.rank, 300, BLOCK, jnp.float32)

    def each_kind(allreduce, tree_mean):
        return lambda v: {kind: (allreduce(f(v), "sum"), allreduce(f(v), "mean"), tree_mean({"a": f(v), "b": [f(v)]}))
                          for kind, f in OPERANDS.items()}

    ring = jax.pmap(each_kind(lambda a, op: jaxring.allreduce(a, AXIS, op, processes=True),
                              lambda t: jaxring.tree_allreduce(t, AXIS, op="mean", processes=True)), AXIS)(x)
    lax = jax.pmap(each_kind(lambda a, op: (jax.lax.psum if op == "sum" else jax.lax.pmean)(a, AXIS),
                             lambda t: jax.lax.pmean(t, AXIS)), AXIS)(x)
    operands = jax.pmap(lambda v: {kind: jnp.asarray(f(v)) for kind, f in OPERANDS.items()}, AXIS)(x)
    for kind in OPERANDS:
        every_device = np.concatenate(comm.allgather(np.asarray(operands[kind])))
        total = every_device.astype(np.float64).sum(0)
        tolerance = world.n_devices * float(jnp.finfo(jnp.float32).eps) * np.abs(every_device.astype(np.float64)).sum(0)
        for got, want, reference in zip(jax.tree.leaves(ring[kind]), jax.tree.leaves(lax[kind]),
                                        [total] + [total / world.n_devices] * 3):
            got = np.asarray(got)
            assert got.dtype == np.asarray(want).dtype and got.shape == (L, *np.shape(reference)), (kind, got.dtype, got.shape)
            assert same_everywhere(got), kind
            assert (np.abs(got.astype(np.float64) - reference) <= tolerance).all(), (kind, got[0], reference)
    passed("operand_kinds")


def check_phases():
    """Each phase of the leg alone (mpi.phase_over_processes, ShardedUpdate's), in jit on one device, against
    numpy: a reduce-scatter (float32, and bfloat16 on the wire) and an all-gather that reads only its chunk."""
    from jaxring.collectives import across_processes

    named = across_processes.communicator(True)
    for chunk in (1, 37):  # one element a process; an odd chunk
        every = [np.random.default_rng(SEED + p).standard_normal(world.size * chunk).astype(np.float32)
                 for p in range(world.size)]
        mine = slice(world.rank * chunk, (world.rank + 1) * chunk)
        total = np.sum(every, axis=0, dtype=np.float64)[mine]
        for wire, rtol in [(None, 1e-6), (jnp.bfloat16, 2e-2)]:
            scatter = jax.jit(lambda v, wire=wire: mpi.phase_over_processes(v, "reduce_scatter", named, 0, "rs", wire))
            got = np.asarray(scatter(every[world.rank]))
            assert got.dtype == np.float32 and got.shape == (chunk,), (got.dtype, got.shape)
            np.testing.assert_allclose(got, total, rtol=rtol, atol=rtol)
        placed = np.full(world.size * chunk, np.nan, np.float32)  # every other chunk ignored
        placed[mine] = every[world.rank][mine]
        gathered = jax.jit(lambda v: mpi.phase_over_processes(v, "all_gather", named, 0, "ag"))(placed)
        np.testing.assert_array_equal(np.asarray(gathered),
                                      np.concatenate([every[p][p * chunk:(p + 1) * chunk] for p in range(world.size)]))
    passed("phases")


def check_sharded_steps():
    """jaxring.ShardedUpdate over every device of every process (the leg's two phases between the local
    halves), adamw with global-norm clipping, 4 steps queued, gradients that differ per device, process and
    step, against the replicated update (allreduce's mean, then optax's clip and adamw on the whole tree):
    the same weights to float32 rounding, the same bits everywhere, the norm float64 numpy's, and each
    device holding only its blocks of the state."""
    import optax

    shapes, steps = {"w": (13, 7), "b": (5,), "v": (40, 9)}, 4  # odd sizes: buckets of 256 bytes, padded
    start = {k: np.random.default_rng([SEED, 70, i]).standard_normal(s).astype(np.float32)
             for i, (k, s) in enumerate(shapes.items())}
    grads = [[{k: 3 * np.random.default_rng([SEED, 71, step, p, i]).standard_normal((L, *s)).astype(np.float32)
               for i, (k, s) in enumerate(shapes.items())} for p in range(world.size)] for step in range(steps)]
    adamw = optax.adamw(0.05, weight_decay=0.1)
    sharded = jaxring.ShardedUpdate(adamw, AXIS, clip_norm=1.0, bucket_bytes=256, processes=True)
    replicated = optax.chain(optax.clip_by_global_norm(1.0), adamw)

    def sharded_step(params, state, g):
        update = sharded.update(g, state, params)
        return update.params, update.opt_state, update.grad_norm

    def replicated_step(params, state, g):
        updates, state = replicated.update(jaxring.allreduce(g, AXIS, op="mean", processes=True), state, params)
        return optax.apply_updates(params, updates), state

    ours = theirs = jax.tree.map(lambda a: np.stack([a] * L), start)
    state, their_state = jax.pmap(sharded.init, AXIS)(ours), jax.pmap(replicated.init, AXIS)(theirs)
    norms = []
    for step in range(steps):  # nothing read until every step is queued
        ours, state, norm = jax.pmap(sharded_step, AXIS)(ours, state, grads[step][world.rank])
        theirs, their_state = jax.pmap(replicated_step, AXIS)(theirs, their_state, grads[step][world.rank])
        norms.append(norm)
    for step, norm in enumerate(norms):
        every = {k: np.concatenate([grads[step][p][k] for p in range(world.size)]).astype(np.float64) for k in shapes}
        want = np.sqrt(sum(np.square(g.mean(0)).sum() for g in every.values()))
        np.testing.assert_allclose(np.asarray(norm), want, rtol=1e-5)
    for k in shapes:
        assert same_everywhere(ours[k]), k
        # adamw's step is about its rate whatever the gradient's size: the sum's float32 rounding moves it far less
        np.testing.assert_allclose(np.asarray(ours[k]), np.asarray(theirs[k]), rtol=0, atol=1e-5, err_msg=k)
    total = sum(int(np.prod(s)) for s in shapes.values())
    held = sum(np.asarray(x).shape[-1] for x in jax.tree.leaves(state[0].mu))
    assert total / world.n_devices <= held < total / world.n_devices + 3, (held, total)  # 3 buckets, each padded
    passed("sharded_steps")


if __name__ == "__main__":
    for name in sys.argv[1:]:
        globals()[f"check_{name}"]()
