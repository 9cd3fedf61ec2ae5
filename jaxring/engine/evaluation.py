"""A task's metrics over batches on this process's devices: during training, and again afterwards.

The trainer evaluates dev and test with `evaluate`; `score_split` scores a
trained model's variables the same way outside training (scripts/evaluate.py's
default, jaxring/engine/launch.py). No MPI here: a communicator, when there is
one, comes in as an argument.
"""

from __future__ import annotations

import collections
import math
from typing import Iterable

import jax
import numpy as np

from jaxring.collectives import agreement
from jaxring.engine.devices import batch_rows, pad_batch, replicate, split_for_devices, split_sources
from jaxring.engine.task import AXIS, DataError, Shard, Task


def make_predict(task: Task):
    return jax.pmap(task.predict, axis_name=AXIS)


def sum_across_processes(counts: dict[str, float], comm) -> dict[str, float]:
    """`counts` summed over the processes of MPI communicator `comm` (None: this process only)."""
    if comm is None:
        return counts
    agreement.agree(comm, "the sum of evaluation counts", "counts")  # every process arrives, within the timeout
    keys = sorted(set().union(*comm.allgather(set(counts))))
    totals = comm.allreduce(np.array([counts.get(k, 0.0) for k in keys], np.float64))  # elementwise sum
    return dict(zip(keys, totals.tolist()))


def evaluate(task: Task, predict, variables, batches: Iterable[dict], n_devices: int, comm=None):
    """Task metrics over `batches` (this process's share), summed across processes.

    `variables` are replicated over the local devices; each batch is padded
    to a multiple of them and the padding's outputs dropped before scoring.
    """
    counts = collections.defaultdict(float)
    for batch in batches:
        batch, _ = split_sources(batch)
        rows = batch_rows(batch)
        padded = pad_batch(batch, math.ceil(rows / n_devices) * n_devices)
        outputs = predict(variables, split_for_devices(padded, n_devices))
        outputs = jax.tree_util.tree_map(lambda x: np.asarray(x).reshape((-1,) + x.shape[2:])[:rows], outputs)
        for key, value in task.score(outputs, batch).items():
            counts[key] += value
    return task.summarize(sum_across_processes(dict(counts), comm))


def score_batches(task: Task, variables, batches: Iterable[dict]) -> dict[str, float]:
    """Task metrics of host (unreplicated) `variables` over `batches`, on every local device of this process."""
    devices = jax.local_devices()
    return evaluate(task, make_predict(task), replicate(variables, devices), batches, len(devices))


def score_split(task: Task, config, variables, split: str, batch_size: int | None = None) -> dict:
    """The task's metrics on `split` ("dev" or "test"), every example, as training scores them.

    `variables`: host (unreplicated) flax variables; `batch_size` None: the run's eval.batch_size.
    """
    if split not in ("dev", "test"):
        raise DataError(f"split {split!r}: the engine scores dev or test (the task's eval_batches)")
    batches = task.eval_batches(split, batch_size or config.eval.batch_size, Shard(0, 1), None)
    return {"split": split, **score_batches(task, variables, batches)}
