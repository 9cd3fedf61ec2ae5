"""Scoring a trained model again, outside training: the same evaluation as the trainer's, on this process's devices."""

from __future__ import annotations

import jax

from jaxring.engine.task import DataError, Shard


def score_split(task, config, variables, split: str, batch_size: int | None = None) -> dict:
    """The task's metrics on `split` ("dev" or "test"), every example, as training scores them.

    `variables`: host (unreplicated) flax variables; `batch_size` None: the run's eval.batch_size.
    """
    from jaxring.engine.trainer import evaluate, make_predict, replicate  # the trainer imports this module's task

    if split not in ("dev", "test"):
        raise DataError(f"split {split!r}: the engine scores dev or test (the task's eval_batches)")
    batches = task.eval_batches(split, batch_size or config.eval.batch_size, Shard(0, 1), None)
    devices = jax.local_devices()
    return {"split": split, **evaluate(task, make_predict(task), replicate(variables, devices), batches, len(devices))}
