"""The user's own optax optimizer, in place of the engine's named ones (optim.py's sgd and adamw).

Either the task has a method `optimizer(self, schedule)`, or the config names
a function by its import path, `optim.name: package.module:function`; either
gets the engine's learning-rate schedule (optim.learning_rate, optim.schedule,
stretched on a resume that changes the run's length: optim.planned_schedule)
and returns an optax GradientTransformation: lion, adafactor, a
multi_transform with frozen parts. What composes: optim.clip_norm clips the
gradients before it, train.compute_dtype and float16's loss scaling act on the
loss and gradients around it. What does not, refused before the first step:
both sources at once, and the settings of the engine's named optimizers
(momentum, nesterov, weight_decay), which the user's own takes as arguments.
"""

from __future__ import annotations

import dataclasses

import optax

from jaxring.engine.config import ConfigError
from jaxring.engine.optim import ELEMENTWISE_OPTIMIZERS, make_optimizer, make_sharded_optimizer
from jaxring.engine.registry import import_target

# optim.py's sgd and adamw read these
NAMED_OPTIMIZERS_SETTINGS = ("momentum", "nesterov", "weight_decay", "weight_decay_mask")


def optimizer_for(cfg, schedule: optax.Schedule, task=None, sharded: bool = False) -> optax.GradientTransformation:
    """The run's optimizer: the task's or the config's own (module docstring), else optim.py's by optim.name;
    `sharded` (train.shard_optimizer): optim.py's elementwise ones only, whose update each device applies to
    its block of the weights (jaxring/collectives/sharded_update.py)."""
    source = _own_source(cfg, task)
    if source is None:
        return (make_sharded_optimizer if sharded else make_optimizer)(cfg, schedule)
    where, function = source
    if sharded:
        raise ConfigError(f"train.shard_optimizer applies the update to each device's block of the weights, which "
                          f"only the elementwise optim.name {', '.join(ELEMENTWISE_OPTIMIZERS)} are known to allow; "
                          f"the optimizer is {where}'s own: set train.shard_optimizer false for it")
    defaults = {field.name: field.default for field in dataclasses.fields(cfg)}
    if changed := [f"optim.{key}" for key in NAMED_OPTIMIZERS_SETTINGS if getattr(cfg, key) != defaults[key]]:
        raise ConfigError(f"{', '.join(changed)} set, but the optimizer is {where}'s own: pass such settings to "
                          "the optax transformation it builds, and leave them out of the optim section")
    transform = function(schedule)
    if not isinstance(transform, optax.GradientTransformation):
        raise TypeError(f"{where} returned a {type(transform).__qualname__}; it must return an optax "
                        "GradientTransformation (optax.lion(schedule), optax.chain(...), ...)")
    if cfg.clip_norm is None:
        return transform
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), transform)


def _own_source(cfg, task):
    """(where it comes from, a function of the schedule), or None for an optimizer optim.py names."""
    own = getattr(task, "optimizer", None)
    path = cfg.name if ":" in cfg.name else None
    if own is not None and path is not None:
        raise ConfigError(f"both {type(task).__qualname__}.optimizer and optim.name {path!r} supply the optimizer: "
                          "keep one")
    default_name = next(field.default for field in dataclasses.fields(cfg) if field.name == "name")
    if own is not None and cfg.name != default_name:
        raise ConfigError(f"optim.name {cfg.name!r} is set, but {type(task).__qualname__}.optimizer supplies the "
                          "optimizer: remove optim.name")
    if own is not None:
        return f"{type(task).__qualname__}.optimizer", own
    if path is not None:
        return f"optim.name {path!r}", import_target(path, f"optim.name {path!r}")
    return None
