"""configs/ds2_tiny.yaml picks its best checkpoint by dev CER: early in training WER stays near or
above 100% while CER falls, and a best-by-WER checkpoint hid that progress."""

import models  # noqa: F401  (registers deepspeech2)
from jaxring.engine.checkpoint import Checkpoints
from jaxring.engine.experiment import load_config
from tests.tiny_runs import CONFIG


def test_the_tiny_config_keeps_the_checkpoint_whose_characters_improved(tmp_path):
    config = load_config(CONFIG)
    checkpoints = Checkpoints(tmp_path, keep=2, best_metric=config.checkpoint.best_metric)
    checkpoints.update_best(50, {"cer": 0.935, "wer": 1.002})  # the numbers of the user's run
    checkpoints.update_best(100, {"cer": 0.818, "wer": 1.016})
    assert checkpoints.best()["step"] == 100 and checkpoints.best()["metric"] == "cer"
