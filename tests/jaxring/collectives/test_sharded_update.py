"""jaxring.ShardedUpdate (jaxring/collectives/sharded_update.py) in one's own pmap loop: against the replicated
update (jaxring.allreduce's mean and the whole optax update on every device), and its two state layouts."""

import functools

import jax
import numpy as np
import optax
import pytest

import jaxring

DEVICES = 3  # odd: every bucket is padded
SHAPES = {"w": (13, 7), "b": (5,), "v": (40, 9)}  # 91 + 5 + 360 floats, in 64-byte buckets and one alone


def tree(rng, lead=()):
    return {k: rng.standard_normal(lead + shape).astype(np.float32) for k, shape in SHAPES.items()}


def test_queued_steps_match_the_replicated_update():
    """(lax's local collectives: tests/jaxring/engine/test_sharded_step.py's float16 run.)"""
    rng = np.random.default_rng(7)
    optimizer = optax.sgd(optax.exponential_decay(0.1, 3, 0.5), momentum=0.9, nesterov=True)
    sharded = jaxring.ShardedUpdate(optimizer, "d", clip_norm=20.0, bucket_bytes=64)
    reference = optax.chain(optax.clip_by_global_norm(20.0), optimizer)
    params = tree(rng)
    stacked = jax.tree.map(lambda a: np.stack([a] * DEVICES), params)
    ours, ours_state = stacked, jax.pmap(sharded.init, axis_name="d")(stacked)
    theirs, theirs_state = stacked, jax.pmap(reference.init)(stacked)

    def sharded_step(p, s, g):
        update = sharded.update(g, s, p)
        return update.params, update.opt_state, update.grad_norm

    def replicated_step(p, s, g):
        g = jaxring.allreduce(g, "d", op="mean")
        updates, s = reference.update(g, s, p)
        return optax.apply_updates(p, updates), s, optax.tree.norm(g)

    sharded_step = jax.pmap(sharded_step, axis_name="d")
    replicated_step = jax.pmap(replicated_step, axis_name="d")
    clipped = 0
    for scale in [1.0, 9.0, 0.3, 4.0, 1.0, 2.5]:  # norms on both sides of clip_norm
        grads = jax.tree.map(lambda a: a * scale, tree(rng, (DEVICES,)))
        ours, ours_state, norm = sharded_step(ours, ours_state, grads)
        theirs, theirs_state, their_norm = replicated_step(theirs, theirs_state, grads)
        clipped += float(their_norm[0]) > 20.0
        np.testing.assert_allclose(np.asarray(norm), np.asarray(their_norm), rtol=1e-6)
    assert 0 < clipped < 6
    # The clipping divides by a norm summed in another order (blocks, not leaves): an ulp of it a step.
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        a, b = np.asarray(a), np.asarray(b)
        assert (a == a[:1]).all()  # the same bits on every device
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    whole = sharded.whole_state([jax.tree.map(lambda x: np.asarray(x)[d], ours_state) for d in range(DEVICES)],
                                params)
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(jax.tree.map(lambda x: np.asarray(x)[0], theirs_state))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # The host layouts convert both ways exactly: what a checkpoint stores and what each device holds.
    for d, blocks in enumerate(sharded.split_state(whole, params, DEVICES)):
        for a, b in zip(jax.tree.leaves(blocks), jax.tree.leaves(ours_state)):
            np.testing.assert_array_equal(a, np.asarray(b)[d])


def test_skip_nonfinite_keeps_every_device_as_it_was():
    sharded = jaxring.ShardedUpdate(optax.adam(0.1), "d", bucket_bytes=64, skip_nonfinite=True)
    params = jax.tree.map(lambda a: np.stack([a] * DEVICES), tree(np.random.default_rng(1)))
    state = jax.pmap(sharded.init, axis_name="d")(params)
    grads = tree(np.random.default_rng(2), (DEVICES,))
    grads["b"][2, 4] = np.inf  # one value on one device
    new_params, new_state, _, finite = jax.pmap(lambda p, s, g: sharded.update(g, s, p), axis_name="d")(
        params, state, grads)
    assert not np.asarray(finite).any()
    for a, b in zip(jax.tree.leaves((new_params, new_state)), jax.tree.leaves((params, state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_arguments_are_refused_when_built():
    with pytest.raises(ValueError, match="local='nccl'"):
        jaxring.ShardedUpdate(optax.sgd(0.1), "d", local="nccl")
    with pytest.raises(ValueError, match="clip_norm=0"):
        jaxring.ShardedUpdate(optax.sgd(0.1), "d", clip_norm=0)


def test_the_mean_gradients_are_the_allreduce_bits():
    """The reduce-scatter adds each element in the all-reduce's order (the CPU engine): with plain sgd at rate 1,
    whose update rounds once per element however XLA fuses it, the weights are the replicated ones bit for bit.
    (An update of more arithmetic, momentum's or adam's, may round a multiply-add differently in another program.)"""
    rng = np.random.default_rng(3)
    optimizer = optax.sgd(1.0)
    sharded = jaxring.ShardedUpdate(optimizer, "d", bucket_bytes=64)
    params = jax.tree.map(lambda a: np.stack([a] * DEVICES), tree(rng))
    grads = [tree(rng, (DEVICES,)) for _ in range(3)]

    @functools.partial(jax.pmap, axis_name="d")
    def both(p, g0, g1, g2):
        s, q, r = sharded.init(p), p, optimizer.init(p)
        for g in (g0, g1, g2):
            p, s, _, _ = sharded.update(g, s, p)
            updates, r = optimizer.update(jaxring.allreduce(g, "d", op="mean"), r, q)
            q = optax.apply_updates(q, updates)
        return p, q

    ours, theirs = both(params, *grads)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_in_shard_map_it_is_the_replicated_adamw_update():
    """The same step in one's own jit(shard_map) loop (check_vma on): the weights come out typed invariant
    (out_specs P()), each device's state as its block (P("d")); queued steps of adamw with a weight-decay mask
    (the 1-D leaf undecayed) against optax's whole update with that mask."""
    mesh = jax.make_mesh((DEVICES,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    spec = jax.sharding.PartitionSpec
    schedule = optax.linear_schedule(0.05, 0.01, 4)
    matrices = lambda params: jax.tree.map(lambda x: x.ndim == 2, params)  # noqa: E731
    sharded = jaxring.ShardedUpdate(optax.adamw(schedule, weight_decay=0.5), "d", clip_norm=30.0, bucket_bytes=64,
                                    decay_mask=matrices)
    rng = np.random.default_rng(11)
    params = tree(rng)
    state = jax.jit(jax.shard_map(lambda p: jax.tree.map(lambda x: x[None], sharded.init(p)), mesh=mesh,
                                  in_specs=spec(), out_specs=spec("d")))(params)

    @jax.jit
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(spec(), spec("d"), spec("d")),
                       out_specs=(spec(), spec("d"), spec()))
    def step(p, s, g):
        update = sharded.update(jax.tree.map(lambda x: x[0], g), jax.tree.map(lambda x: x[0], s), p)
        return update.params, jax.tree.map(lambda x: x[None], update.opt_state), update.grad_norm

    reference = optax.chain(optax.clip_by_global_norm(30.0), optax.adamw(schedule, weight_decay=0.5, mask=matrices))
    theirs, theirs_state = params, reference.init(params)
    ours = params
    for scale in [1.0, 12.0, 0.5]:
        grads = jax.tree.map(lambda a: a * scale, tree(rng, (DEVICES,)))
        ours, state, norm = step(ours, state, grads)
        mean = jax.tree.map(lambda g: np.mean(g.astype(np.float64), axis=0).astype(np.float32), grads)
        updates, theirs_state = reference.update(mean, theirs_state, theirs)
        theirs = optax.apply_updates(theirs, updates)
        np.testing.assert_allclose(float(norm), float(optax.tree.norm(mean)), rtol=1e-5)
    # adam's normalised step, a few ulps of the mean's summation order apart, a step.
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert jax.tree.leaves(state)[-1].shape[0] == DEVICES
