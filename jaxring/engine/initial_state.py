"""The initial state checked once, before the first step: what a checkpoint could not write fails here, not
after the training steps before the first checkpoint.

`init` must return a dict of Flax variables: "params" and any other collections, nested dicts of numeric
arrays (the Task contract, jaxring/engine/task.py). An NNX model returns them through
jaxring/engine/nnx_task.py's NNXTask.
"""

from __future__ import annotations

from typing import Mapping

from jaxring.engine.checkpoint import unserialisable

_WHAT_TO_RETURN = ('return {"params": ..., other collections}, nested dicts of arrays (the Task contract, '
                   "jaxring/engine/task.py); an NNX model: subclass jaxring.engine.nnx_task.NNXTask, which splits "
                   "and merges its state")


def checked_variables(task, variables) -> dict:
    """`variables` (what `task.init` returned), or a TypeError naming what it got and what to return."""
    name = f"{type(task).__qualname__}.init"
    if not isinstance(variables, Mapping) or "params" not in variables:
        got = f"a {type(variables).__module__}.{type(variables).__qualname__}"
        got += f" with keys {sorted(map(str, variables))}" if isinstance(variables, Mapping) else ""
        raise TypeError(f"{name} returned {got}, with no 'params': {_WHAT_TO_RETURN}")
    if problems := unserialisable(dict(variables)):
        raise TypeError(f"{name} returned variables a checkpoint cannot hold: {'; '.join(problems[:8])}. "
                        + _WHAT_TO_RETURN)
    return dict(variables)


def checked_optimizer_state(opt_state):
    """`opt_state`, or a TypeError naming what of it a checkpoint cannot hold (an optimizer of the task's own)."""
    if problems := unserialisable(opt_state):
        raise TypeError(f"the optimizer's initial state holds what a checkpoint cannot: {'; '.join(problems[:8])}; "
                        "its state must be arrays in tuples, lists, dicts or optax's named tuples")
    return opt_state
