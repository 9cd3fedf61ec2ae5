"""Training batches as this process's slices of one sequence of global batches (Batches.global_order).

A task whose examples can be listed per epoch from the seed and the epoch alone subclasses
GlobalBatches and gives that list (`epoch_order`) and how to build a batch from part of it
(`batch`). The slicing, the position and the promise that the process count does not change
the order live here once, so a run may resume on another number of processes
(jaxring/engine/run_shape.py, resume_note).
"""

from typing import Iterator

import numpy as np

from jaxring.engine.task import Shard


class GlobalBatches:
    """This process's batches, epoch after epoch: each global batch (`batch_size` x the processes) is the
    next run of `epoch_order(epoch)`, cut into one `batch_size` slice per process, in process order.
    Resumable: state() is (epoch, step)."""

    global_order = True  # a slice of each global batch, in an order the process count does not change

    def __init__(self, examples_per_epoch: int, batch_size: int, shard: Shard, examples: str, to_raise: str):
        """`examples` names what an epoch lists, with its count (for the error where there are too few for
        one global batch); `to_raise` the setting that gives more."""
        self.batch_size, self.shard = batch_size, shard
        self.steps_per_epoch = examples_per_epoch // (batch_size * shard.count)
        if self.steps_per_epoch == 0:
            raise ValueError(f"{examples} are fewer than one global batch ({batch_size} x {shard.count} processes): "
                             f"raise {to_raise}")
        self.epoch, self.step = 0, 0

    def epoch_order(self, epoch: int) -> np.ndarray:
        """What epoch `epoch` lists, in order (at least steps_per_epoch global batches of it): a function of
        the seed and `epoch` alone."""
        raise NotImplementedError

    def batch(self, part: np.ndarray) -> dict:
        """The batch of `part`, `batch_size` entries of an epoch's order."""
        raise NotImplementedError

    def state(self) -> dict:
        return {"epoch": self.epoch, "step": self.step}

    def restore(self, state: dict) -> None:
        self.epoch, self.step = state["epoch"], state["step"]

    def __iter__(self) -> Iterator[dict]:
        while True:
            order = self.epoch_order(self.epoch)
            while self.step < self.steps_per_epoch:
                first = (self.step * self.shard.count + self.shard.index) * self.batch_size
                self.step += 1
                yield self.batch(order[first : first + self.batch_size])
            self.epoch, self.step = self.epoch + 1, 0
