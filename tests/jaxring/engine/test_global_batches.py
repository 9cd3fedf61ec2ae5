"""GlobalBatches: the processes' slices of one sequence of global batches, whatever the process count,
and a resumed position that goes on as the straight run."""

import itertools

import numpy as np
import pytest

from jaxring.engine.global_batches import GlobalBatches
from jaxring.engine.task import Shard

EXAMPLES = 29  # odd: each epoch leaves some examples out of every global batch


class Numbered(GlobalBatches):
    """Each batch is the example numbers it holds; each epoch a permutation from the seed and the epoch."""

    def __init__(self, batch_size, shard, seed=5):
        super().__init__(EXAMPLES, batch_size, shard, f"the {EXAMPLES} numbers", "EXAMPLES")
        self.seed = seed

    def epoch_order(self, epoch):
        return np.random.default_rng((self.seed, epoch)).permutation(EXAMPLES)

    def batch(self, part):
        return {"n": part.copy()}


def global_batches(global_batch, steps):
    """Brute force: each epoch's permutation cut into whole global batches, the rest left out."""
    out = []
    for epoch in itertools.count():
        order = np.random.default_rng((5, epoch)).permutation(EXAMPLES)
        for start in range(0, EXAMPLES - global_batch + 1, global_batch):
            out.append(order[start : start + global_batch])
            if len(out) == steps:
                return out


@pytest.mark.parametrize("processes", [1, 2, 3])
def test_the_processes_slices_make_the_same_global_batches_whatever_their_count(processes):
    per_process = 12 // processes
    streams = [iter(Numbered(per_process, Shard(index, processes))) for index in range(processes)]
    for step, want in enumerate(global_batches(12, 7)):  # 2 global batches per epoch: 3 epochs and a half
        got = np.concatenate([next(stream)["n"] for stream in streams])
        np.testing.assert_array_equal(got, want, err_msg=f"step {step}")


def test_a_restored_position_goes_on_as_the_straight_run_even_on_another_process_count():
    batches = Numbered(6, Shard(0, 1))  # 4 global batches per epoch
    straight = iter(batches)
    for _ in range(5):
        next(straight)
    assert batches.state() == {"epoch": 1, "step": 1}
    on_two = Numbered(3, Shard(1, 2))
    on_two.restore(batches.state())
    np.testing.assert_array_equal(next(iter(on_two))["n"], next(straight)["n"][3:])
    assert on_two.state() == batches.state() == {"epoch": 1, "step": 2}
    assert Numbered.global_order


def test_fewer_examples_than_a_global_batch_name_the_setting_to_raise():
    with pytest.raises(ValueError, match=r"the 29 numbers are fewer than one global batch \(10 x 3 processes\): "
                                         r"raise EXAMPLES"):
        Numbered(10, Shard(0, 3))
