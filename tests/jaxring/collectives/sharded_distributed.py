"""jaxring.ShardedUpdate under jax.distributed, run by mpi_workers/distributed.py: in one's own jit(shard_map) loop
(check_vma on) over a mesh axis that spans every process, each of the S devices holds 1/S of adamw's state and
the weights are those of optax's whole update of the mean gradients; processes= there is refused while tracing."""

import functools
import time

import jax
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxring

SHAPES = {"w": (13, 7), "b": (7,), "v": (40, 9)}  # 458 floats in one bucket: padded over 4 or 6 devices
CLIP = 30.0


def _grads(process, step, local_devices):
    """Process `process`'s gradients at `step`, one row per local device: random, scaled to both sides of CLIP."""
    rng = np.random.default_rng([5, process, step])
    scale = (1.0, 9.0, 0.4, 3.0)[step]
    return {k: (rng.standard_normal((local_devices, *s)) * scale).astype(np.float32) for k, s in SHAPES.items()}


def check(mesh, comm):
    """Four queued steps against optax on float64 means, the same bits on every device; processes= refused."""
    rank, size, local = comm.Get_rank(), comm.Get_size(), jax.local_device_count()
    matrices = lambda params: jax.tree.map(lambda x: x.ndim == 2, params)  # noqa: E731
    schedule = optax.linear_schedule(0.05, 0.01, 4)
    optimizer = optax.adamw(schedule, weight_decay=0.5)
    sharded = jaxring.ShardedUpdate(optimizer, "x", clip_norm=CLIP, decay_mask=matrices)
    start = {k: np.random.default_rng(1).standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    whole, blocks = NamedSharding(mesh, P()), NamedSharding(mesh, P("x"))

    def init_of(update):
        return jax.jit(jax.shard_map(lambda p: jax.tree.map(lambda x: x[None], update.init(p)), mesh=mesh,
                                     in_specs=P(), out_specs=P("x")))

    @jax.jit
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("x"), P("x")), out_specs=(P(), P("x"), P()))
    def step(p, s, g):
        update = sharded.update(jax.tree.map(lambda x: x[0], g), jax.tree.map(lambda x: x[0], s), p)
        return update.params, jax.tree.map(lambda x: x[None], update.opt_state), update.grad_norm

    ours = jax.tree.map(lambda a: jax.make_array_from_process_local_data(whole, a), start)
    state = init_of(sharded)(ours)
    reference = optax.chain(optax.clip_by_global_norm(CLIP), optax.adamw(schedule, weight_decay=0.5, mask=matrices))
    theirs, theirs_state = start, reference.init(start)
    for k in range(4):
        grads = jax.tree.map(lambda a: jax.make_array_from_process_local_data(blocks, a), _grads(rank, k, local))
        ours, state, norm = step(ours, state, grads)
        every = [_grads(p, k, local) for p in range(size)]
        mean = {key: np.concatenate([g[key] for g in every]).astype(np.float64).mean(0).astype(np.float32)
                for key in SHAPES}
        updates, theirs_state = reference.update(mean, theirs_state, theirs)
        theirs = optax.apply_updates(theirs, updates)
        np.testing.assert_allclose(float(norm.addressable_shards[0].data), float(optax.tree.norm(mean)), rtol=1e-5)
    for key in SHAPES:
        shards = [np.asarray(shard.data) for shard in ours[key].addressable_shards]
        assert len({shard.tobytes() for shard in shards}) == 1, key  # this process' devices
        assert len(set(comm.allgather(shards[0].tobytes()))) == 1, key  # and every process'
        # adam's normalised step, a few ulps of the mean's summation order apart, a step.
        np.testing.assert_allclose(shards[0], theirs[key], rtol=1e-5, atol=1e-6, err_msg=key)
    moments = jax.tree.leaves(state[0].mu)  # adamw's first moment: one block of the bucket per device
    assert moments[0].shape == (size * local, -(-sum(np.prod(s) for s in SHAPES.values()) // (size * local)))

    twice = jaxring.ShardedUpdate(optimizer, "x", processes=True)
    began = time.monotonic()
    try:
        init_of(twice)(ours)
        raise AssertionError("ShardedUpdate(processes=True) over an axis spanning processes was not refused")
    except ValueError as error:
        assert "ShardedUpdate('x', processes=...)" in str(error) and "Drop processes=" in str(error), error
    assert time.monotonic() - began < 60

