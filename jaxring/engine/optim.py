"""Optimizers and learning-rate schedules by the names an experiment's `optim:` section uses.

To add one, add an entry to OPTIMIZERS or SCHEDULES (and its settings to
OptimConfig in config.py); the config accepts exactly the names listed here.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

# The `optim:` section, jaxring.engine.config.OptimConfig; not imported: config.py imports this module's names.
OptimSection = Any

# optim.weight_decay_mask -> the weights that decay (optax's mask: a tree of bools from the weights), None: all
DECAY_MASKS: dict[str, Callable | None] = {
    "all": None,
    "matrices": lambda params: jax.tree_util.tree_map(lambda leaf: jnp.ndim(leaf) >= 2, params),
}

# name -> (optim config, schedule) -> optimizer
OPTIMIZERS: dict[str, Callable[[OptimSection, optax.Schedule], optax.GradientTransformation]] = {
    "sgd": lambda cfg, schedule: optax.sgd(schedule, momentum=cfg.momentum or None, nesterov=cfg.nesterov),
    "adamw": lambda cfg, schedule: optax.adamw(schedule, weight_decay=cfg.weight_decay,
                                               mask=DECAY_MASKS[cfg.weight_decay_mask]),
}

# What train.shard_optimizer takes (jaxring/collectives/sharded_update.py): updates that are elementwise once the
# gradients' global norm is known, so each device can apply them to its own block of the weights.
ELEMENTWISE_OPTIMIZERS = ("sgd", "adamw")

# name -> (optim config, steps per epoch, total steps) -> schedule
SCHEDULES: dict[str, Callable[[OptimSection, int, int], optax.Schedule]] = {
    "anneal": lambda cfg, epoch_steps, total_steps: optax.exponential_decay(
        cfg.learning_rate, epoch_steps, 1.0 / cfg.anneal_factor, staircase=True
    ),
    "warmup_cosine": lambda cfg, epoch_steps, total_steps: optax.warmup_cosine_decay_schedule(
        0.0, cfg.learning_rate, cfg.warmup_steps, max(total_steps, cfg.warmup_steps + 1), cfg.final_learning_rate
    ),
    "constant": lambda cfg, epoch_steps, total_steps: optax.constant_schedule(cfg.learning_rate),
}


def _lookup(table: dict, kind: str, name: str):
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; valid names: {', '.join(table)}") from None


def learning_rate_schedule(cfg: OptimSection, steps_per_epoch: int, total_steps: int) -> optax.Schedule:
    return _lookup(SCHEDULES, "optim.schedule", cfg.schedule)(cfg, steps_per_epoch, total_steps)


def planned_schedule(cfg: OptimSection, steps_per_epoch: int, plan) -> optax.Schedule:
    """The learning rate of a run whose length `plan` lists as [[0, T0], [s1, T1], ...]: the step each
    (re)start began at and the total steps it was then to run.

    The first entry plans `cfg`'s schedule over T0. Each resume with another length keeps the rate the run
    had reached at its step and stretches what was left of the schedule to the new end, so the rate never
    jumps back up (to warm-up's, say) unless the optim settings themselves change. A finished run trained
    longer goes on at its last rate.
    """
    (_, first_total), *changes = plan
    schedule = learning_rate_schedule(cfg, steps_per_epoch, first_total)
    for (start, total), (_, previous_total) in zip(changes, plan):
        schedule = _stretched(schedule, start, previous_total, total)
    return schedule


def _stretched(schedule: optax.Schedule, start: int, old_end: int, new_end: int) -> optax.Schedule:
    # new_end > start: a resume at or past the run's end is refused (jaxring/engine/rundir.py).
    factor = max(old_end - start, 0) / (new_end - start)
    return lambda count: schedule(jnp.where(count <= start, count, start + (count - start) * factor))


def make_optimizer(cfg: OptimSection, schedule: optax.Schedule) -> optax.GradientTransformation:
    optimizer = _lookup(OPTIMIZERS, "optim.name", cfg.name)(cfg, schedule)
    if cfg.clip_norm is None:
        return optimizer
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), optimizer)


def make_sharded_optimizer(cfg: OptimSection, schedule: optax.Schedule) -> optax.GradientTransformation:
    """make_optimizer's optimizer for train.shard_optimizer: the clipping is left to the sharded update
    (its norm is a sum over every device's block), optax.identity in its place keeping the state's
    layout, so a checkpoint resumes with or without the setting; so is adamw's weight-decay mask
    (decay_mask_of: the optimizer sees flat blocks, not the weights' leaves)."""
    if cfg.name not in ELEMENTWISE_OPTIMIZERS:
        raise ValueError(f"train.shard_optimizer applies optim.name {cfg.name!r} to each device's block of the "
                         f"weights, which needs an elementwise update; it takes {', '.join(ELEMENTWISE_OPTIMIZERS)}. "
                         "Set train.shard_optimizer false for this optimizer.")
    if decay_mask_of(cfg) is None:
        optimizer = _lookup(OPTIMIZERS, "optim.name", cfg.name)(cfg, schedule)
    else:  # optax.masked's state, as the replicated step's; every block decays, but for the weights outside the mask
        optimizer = optax.adamw(schedule, weight_decay=cfg.weight_decay,
                                mask=lambda blocks: jax.tree_util.tree_map(lambda _: True, blocks))
    return optimizer if cfg.clip_norm is None else optax.chain(optax.identity(), optimizer)


def decay_mask_of(cfg: OptimSection) -> Callable | None:
    """adamw's weight-decay mask for jaxring.ShardedUpdate's decay_mask (train.shard_optimizer), None for all."""
    return DECAY_MASKS[cfg.weight_decay_mask] if cfg.name == "adamw" else None
