"""Optimizers and learning-rate schedules by the names an experiment's `optim:` section uses.

To add one, add an entry to OPTIMIZERS or SCHEDULES (and its settings to
OptimConfig in config.py); the config accepts exactly the names listed here.
"""

from __future__ import annotations

from typing import Any, Callable

import optax

# The `optim:` section, jaxring.engine.config.OptimConfig; not imported: config.py imports this module's names.
OptimSection = Any

# name -> (optim config, schedule) -> optimizer
OPTIMIZERS: dict[str, Callable[[OptimSection, optax.Schedule], optax.GradientTransformation]] = {
    "sgd": lambda cfg, schedule: optax.sgd(schedule, momentum=cfg.momentum or None, nesterov=cfg.nesterov),
    "adamw": lambda cfg, schedule: optax.adamw(schedule, weight_decay=cfg.weight_decay),
}

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


def make_optimizer(cfg: OptimSection, schedule: optax.Schedule) -> optax.GradientTransformation:
    optimizer = _lookup(OPTIMIZERS, "optim.name", cfg.name)(cfg, schedule)
    if cfg.clip_norm is None:
        return optimizer
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), optimizer)
