"""examples/sharded_training.py: the classifier trained with jaxring.ShardedUpdate next to the replicated update."""

import pytest

from tests.tiny_runs import ROOT


@pytest.fixture(scope="module")
def sharded_training():
    import sys

    sys.path.insert(0, str(ROOT / "examples"))  # as running the script puts its folder first
    import sharded_training

    return sharded_training


def test_the_sharded_model_learns_as_the_replicated_one_with_an_eighth_of_the_state(sharded_training):
    result = sharded_training.main(["--steps", "25"])  # of the script's 150: enough to learn, and quick
    assert result["devices"] == 8 and result["last_loss"] < 0.7 * result["first_loss"], result
    assert result["dev_error_rate"] < 0.25, result  # chance is 75% errors on 4 classes
    # adamw on flat blocks: XLA may contract a multiply-add elsewhere than on the leaves' shapes, a few ulps.
    assert result["max_difference_from_replicated"] < 1e-5 and result["same_bits_on_every_device"], result
    held = result["optimizer_state_bytes_per_device"]
    # adam's two moments: 1/8 of each (rounded up to whole blocks), and the step counts, on each device.
    assert held["sharded"] < held["replicated"] / 8 + 64, held
