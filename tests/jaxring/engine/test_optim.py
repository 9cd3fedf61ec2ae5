"""The optimizers and learning-rate schedules of jaxring/engine/optim.py against numpy."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxring.engine import config as config_lib
from jaxring.engine import optim
from jaxring.engine.config import ConfigError


def test_nesterov_sgd_with_clipping_matches_numpy():
    cfg = config_lib.OptimConfig(name="sgd", learning_rate=0.1, momentum=0.99, nesterov=True, clip_norm=1.0)
    optimizer = optim.make_optimizer(cfg, optim.learning_rate_schedule(cfg, 10, 100))
    rng = np.random.default_rng(1)
    params = rng.normal(size=7)
    state = optimizer.init(jnp.asarray(params, jnp.float32))
    p, velocity = params.copy(), np.zeros(7)
    current = jnp.asarray(params, jnp.float32)
    for _ in range(3):
        grad = rng.normal(size=7) * 3
        clipped = grad * min(1.0, 1.0 / np.linalg.norm(grad))
        velocity = 0.99 * velocity + clipped
        p = p - 0.1 * (clipped + 0.99 * velocity)  # Nesterov: look ahead along the new velocity
        updates, state = optimizer.update(jnp.asarray(grad, jnp.float32), state, current)
        current = optax.apply_updates(current, updates)
    np.testing.assert_allclose(current, p, rtol=1e-5)


def test_schedules():
    anneal = config_lib.OptimConfig(learning_rate=6e-4, schedule="anneal", anneal_factor=1.2)
    schedule = optim.learning_rate_schedule(anneal, steps_per_epoch=5, total_steps=50)
    assert [float(schedule(s)) for s in (0, 4)] == pytest.approx([6e-4, 6e-4])
    assert float(schedule(5)) == pytest.approx(6e-4 / 1.2) and float(schedule(14)) == pytest.approx(6e-4 / 1.44)
    cosine = config_lib.OptimConfig(learning_rate=1.0, schedule="warmup_cosine", warmup_steps=10, final_learning_rate=0.1)
    schedule = optim.learning_rate_schedule(cosine, steps_per_epoch=5, total_steps=110)
    assert float(schedule(5)) == pytest.approx(0.5)
    assert float(schedule(10)) == pytest.approx(1.0)
    assert float(schedule(60)) == pytest.approx(0.55)  # halfway down the cosine
    assert float(schedule(110)) == pytest.approx(0.1)
    # a run shorter than its warmup: the rate peaks at the warmup's end and is final one step later
    short = optim.learning_rate_schedule(cosine, steps_per_epoch=5, total_steps=4)
    assert [float(short(s)) for s in (4, 10, 11)] == pytest.approx([0.4, 1.0, 0.1])


def test_a_longer_run_goes_on_from_the_rate_it_reached_and_never_jumps_back_up():
    cosine = config_lib.OptimConfig(learning_rate=1.0, schedule="warmup_cosine", warmup_steps=10, final_learning_rate=0.1)
    planned = optim.learning_rate_schedule(cosine, steps_per_epoch=5, total_steps=110)
    # Resumed at step 60 of 110 with 210 steps in all: the rate at 60 is kept and the cosine's
    # second half is stretched over 60..210; the first 60 steps are as planned.
    longer = optim.planned_schedule(cosine, 5, [[0, 110], [60, 210]])
    assert [float(longer(s)) for s in (5, 10, 60)] == pytest.approx([float(planned(s)) for s in (5, 10, 60)])
    assert float(longer(135)) == pytest.approx(float(planned(85)))  # halfway through what was left
    rates = [float(longer(s)) for s in range(60, 211)]
    assert all(b <= a + 1e-7 for a, b in zip(rates, rates[1:])) and rates[-1] == pytest.approx(0.1)
    # A finished run trained longer, twice: it stays at its last rate, the warm-up never comes back.
    twice = optim.planned_schedule(cosine, 5, [[0, 110], [110, 150], [150, 200]])
    assert [float(twice(s)) for s in (110, 111, 150, 199)] == pytest.approx([0.1] * 4)
    # Shortened while still warming up: the remaining warm-up and decay are squeezed into what is left.
    shorter = optim.planned_schedule(cosine, 5, [[0, 110], [5, 30]])
    assert float(shorter(5)) == pytest.approx(0.5) and float(shorter(30)) == pytest.approx(0.1)
    anneal = config_lib.OptimConfig(learning_rate=6e-4, schedule="anneal", anneal_factor=1.2)
    one_plan = optim.planned_schedule(anneal, 5, [[0, 50]])
    assert [float(one_plan(s)) for s in range(60)] == [float(optim.learning_rate_schedule(anneal, 5, 50)(s))
                                                        for s in range(60)]


def test_adamw_matches_numpy():
    cfg = config_lib.OptimConfig(name="adamw", learning_rate=0.01, weight_decay=0.1, clip_norm=None, schedule="constant")
    optimizer = optim.make_optimizer(cfg, optim.learning_rate_schedule(cfg, 10, 100))
    rng = np.random.default_rng(3)
    p = rng.normal(size=5)
    m, v = np.zeros(5), np.zeros(5)
    current = jnp.asarray(p, jnp.float32)
    state = optimizer.init(current)
    for t in range(1, 4):
        grad = rng.normal(size=5)
        m, v = 0.9 * m + 0.1 * grad, 0.999 * v + 0.001 * grad**2
        step = (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
        p = p - 0.01 * (step + 0.1 * p)
        updates, state = optimizer.update(jnp.asarray(grad, jnp.float32), state, current)
        current = optax.apply_updates(current, updates)
    np.testing.assert_allclose(current, p, rtol=1e-5)


def test_adamw_decays_only_the_matrices_under_that_mask():
    """optim.weight_decay_mask matrices: a bias and a norm's scale (1-D) keep their weights under a zero gradient."""
    rng = np.random.default_rng(4)
    params = {"w": rng.normal(size=(3, 4)).astype(np.float32), "b": rng.normal(size=4).astype(np.float32),
              "scale": rng.normal(size=4).astype(np.float32)}
    grads = jax.tree.map(np.zeros_like, params)
    for mask, decayed in [("all", {"w", "b", "scale"}), ("matrices", {"w"})]:
        cfg = config_lib.OptimConfig(name="adamw", learning_rate=0.01, weight_decay=0.1, weight_decay_mask=mask)
        optimizer = optim.make_optimizer(cfg, optim.learning_rate_schedule(cfg, 10, 100))
        updates, _ = optimizer.update(grads, optimizer.init(params), params)
        for key, update in updates.items():
            np.testing.assert_allclose(update, -0.01 * 0.1 * params[key] if key in decayed else 0 * update, rtol=1e-6)
    with pytest.raises(ConfigError, match="optim.weight_decay_mask"):
        config_lib.OptimConfig(name="adamw", weight_decay_mask="biases")


def test_the_engine_defaults_are_plain_sgd_at_a_constant_rate_without_clipping():
    cfg = config_lib.OptimConfig(learning_rate=0.1)
    optimizer = optim.make_optimizer(cfg, optim.learning_rate_schedule(cfg, steps_per_epoch=2, total_steps=100))
    rng = np.random.default_rng(4)
    p = rng.normal(size=6)
    current = jnp.asarray(p, jnp.float32)
    state = optimizer.init(current)
    for _ in range(5):  # past two epochs: an annealed rate would have changed
        grad = rng.normal(size=6) * 1e3  # far above any clip norm
        p = p - 0.1 * grad
        updates, state = optimizer.update(jnp.asarray(grad, jnp.float32), state, current)
        current = optax.apply_updates(current, updates)
    np.testing.assert_allclose(current, p, rtol=1e-5)
    with pytest.raises(config_lib.ConfigError, match="optim.schedule anneal needs optim.anneal_factor"):
        config_lib.OptimConfig(schedule="anneal")


def test_unknown_optimizer_names_the_valid_ones():
    cfg = SimpleNamespace(name="lamb", clip_norm=None)
    with pytest.raises(ValueError, match="unknown optim.name 'lamb'; valid names: sgd, adamw"):
        optim.make_optimizer(cfg, optax.constant_schedule(0.1))
