"""What the step takes of a training batch: train.batch_size / processes rows, split evenly over the local devices.

A batch that does not split is the loader's fault (the task's Batches) and is refused naming it; one of
another size compiles the step again, which train.off_size_batches warns about once or refuses.
"""

from __future__ import annotations

import warnings

import jax
import numpy as np


class BatchCheck:
    """Checks each training batch of `loader` before the step takes it (train: the config's `train:` section)."""

    def __init__(self, loader, train, world_size: int, n_local: int, rank: int):
        self.loader = type(loader)
        self.train = train
        self.world_size = world_size
        self.n_local = n_local
        self.rank = rank
        self.warned_off_size = False

    def __call__(self, batch: dict, step: int) -> None:
        """Refuses a batch the step cannot take, blaming the loader that yielded it; warns once (or refuses,
        train.off_size_batches) about one of another size than the config's, which compiles the step again."""
        rows = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in jax.tree_util.tree_leaves(batch)}
        expected = self.train.batch_size // self.world_size
        (got,) = rows if len(rows) == 1 else (None,)
        if got == expected:
            return
        loader = self.loader
        shapes = ", ".join(f"{jax.tree_util.keystr(path)} {np.asarray(leaf).dtype}{list(np.shape(leaf))}"
                           for path, leaf in jax.tree_util.tree_flatten_with_path(batch)[0])
        where = f"rank {self.rank}, " if self.world_size > 1 else ""
        what = (f"{where}step {step}: the task's training batches ({loader.__module__}.{loader.__qualname__}) yielded "
                f"{shapes}, where the step takes {expected} rows per process (train.batch_size "
                f"{self.train.batch_size} over {self.world_size} process{'es' if self.world_size > 1 else ''})")
        if got is None or got % self.n_local:
            reason = ("its leaves do not all have the same number of rows" if got is None else
                      f"{got} rows do not split evenly over {self.n_local} local devices")
            raise ValueError(f"{what}: {reason}. The loader is at fault: make it yield {expected} rows per batch.")
        if self.train.off_size_batches == "refuse":
            raise ValueError(f"{what}, and train.off_size_batches is 'refuse'. Make the loader yield {expected} "
                             "rows per batch, or set train.off_size_batches=warn to train on it.")
        if not self.warned_off_size:
            self.warned_off_size = True
            warnings.warn(f"{what}: the step compiles again for each new batch size (seconds each); "
                          f"make the loader yield {expected} rows, or set train.off_size_batches=refuse to stop "
                          "at such a batch. Warned once.", stacklevel=2)
