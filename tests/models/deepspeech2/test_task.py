"""The Deep Speech 2 task adapter: loss weighting, scoring against jiwer, replicas vs one device, batches."""

from pathlib import Path

import jax
import jiwer
import numpy as np
import pytest

import models  # noqa: F401  (registers deepspeech2)
from jaxring.engine.experiment import load_config
from jaxring.engine import config as config_lib
from jaxring.engine.task import Shard
from jaxring.engine.devices import replicate, unreplicate
from jaxring.engine.trainer import Trainer
from models.deepspeech2 import alphabet
from models.deepspeech2.data import read_manifest
from models.deepspeech2.model import ModelConfig
from models.deepspeech2.augment import AugmentConfig
from models.deepspeech2.task import DataConfig, DeepSpeech2Task

TINY_MODEL = {"conv_layers": 1, "conv_channels": [2], "rnn_layers": 1, "rnn_hidden": 8}


def random_batch(rng, size, frames=40, label_length=6):
    return {
        "features": rng.normal(size=(size, frames, 161)).astype(np.float32),
        "feature_lengths": rng.integers(frames // 2, frames + 1, size=size).astype(np.int32),
        "labels": rng.integers(1, alphabet.SIZE, size=(size, label_length)).astype(np.int32),
        "label_lengths": rng.integers(1, label_length + 1, size=size).astype(np.int32),
        "weights": np.ones(size, np.float32),
    }


@pytest.fixture(scope="module")
def task():
    return DeepSpeech2Task(config_lib.section_from_dict(ModelConfig, TINY_MODEL, "model"), DataConfig())


def test_filler_rows_change_neither_loss_nor_gradients(task):
    """Rows with weight 0 and no frames (what fills a partial batch) are invisible to training."""
    variables = task.init(jax.random.PRNGKey(0))

    def loss(params, batch):
        return task.loss({**variables, "params": params}, batch, None)[0]

    loss_and_grads = jax.pmap(jax.value_and_grad(loss), axis_name="batch")
    params = replicate(variables["params"], jax.local_devices()[:1])
    results = []
    for filler_seed in (1, 2):
        batch = random_batch(np.random.default_rng(0), 6)
        filler = random_batch(np.random.default_rng(filler_seed), 6)
        for key in ("features", "labels"):
            batch[key][4:] = filler[key][4:]
        batch["feature_lengths"][4:] = batch["label_lengths"][4:] = 0
        batch["weights"][4:] = 0
        results.append(loss_and_grads(params, jax.tree_util.tree_map(lambda x: x[None], batch)))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert np.isfinite(loss_a[0]) and loss_a[0] > 0
    np.testing.assert_array_equal(loss_a, loss_b)
    for a, b in zip(jax.tree_util.tree_leaves(grads_a), jax.tree_util.tree_leaves(grads_b)):
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b)


def test_scores_match_jiwer_over_the_whole_set(task):
    rng = np.random.default_rng(1)
    texts = ["the cat", "a dog sat", "hello world", "x", "blue sky day"]
    labels = np.zeros((5, 12), np.int32)
    for i, t in enumerate(texts):
        labels[i, : len(t)] = alphabet.encode(t)
    batch = {"labels": labels, "label_lengths": np.array([len(t) for t in texts], np.int32), "weights": np.ones(5)}
    batch["weights"][3] = 0  # a filler row: not scored
    logits = rng.normal(size=(5, 30, alphabet.SIZE)).astype(np.float32)
    logits[0, ::2, 0] += 10  # make some hypotheses partly right
    lengths = np.array([30, 25, 20, 30, 10])
    first = task.score({"logits": logits[:2], "lengths": lengths[:2]}, {k: v[:2] for k, v in batch.items()})
    second = task.score({"logits": logits[2:], "lengths": lengths[2:]}, {k: v[2:] for k, v in batch.items()})
    result = task.summarize({k: first[k] + second[k] for k in first})
    from models.deepspeech2.ctc_decoders import greedy_decode

    kept = [0, 1, 2, 4]
    hyps = greedy_decode(logits[kept], lengths[kept])
    refs = [texts[i] for i in kept]
    assert result["utterances"] == 4
    assert result["cer"] == pytest.approx(jiwer.cer(refs, hyps))
    assert result["wer"] == pytest.approx(jiwer.wer(refs, hyps))


class FixedBatches:
    steps_per_epoch = 3

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def state(self):
        return {}

    def restore(self, state):
        pass


def test_replicas_with_synced_batch_norm_match_one_device(task, tmp_path):
    rng = np.random.default_rng(2)
    batches = [random_batch(rng, 8) for _ in range(2)]
    for batch in batches:
        # Synced batch norm averages per-device statistics, exact only when every
        # device holds as many real frames (flax's masked BatchNorm under axis_name).
        batch["feature_lengths"][:] = batch["features"].shape[1]
    config = config_lib.build(
        {"model": TINY_MODEL, "train": {"batch_size": 8, "allreduce": "psum"}, "optim": {"name": "adamw", "learning_rate": 1e-3}},
        DeepSpeech2Task.config_sections,
    )
    finals = []
    for n_devices in (1, 4):
        world = type("World", (), {"rank": 0, "size": 1, "local_devices": jax.local_devices()[:n_devices]})
        trainer = Trainer(task, config, tmp_path / str(n_devices), world, batches=FixedBatches(batches))
        state = replicate(trainer.init_state(), trainer.devices)
        for batch in batches:
            state, _ = trainer.train_step(state, batch)
        finals.append(unreplicate(state))
    for a, b in zip(jax.tree_util.tree_leaves(finals[0]), jax.tree_util.tree_leaves(finals[1])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("num_features", [161, 40])  # the spectrogram, mel bands
def test_batches_from_a_synthetic_corpus(tmp_path, num_features):
    model = config_lib.section_from_dict(ModelConfig, {**TINY_MODEL, "num_features": num_features}, "model")
    task = DeepSpeech2Task(model, DataConfig(cache_dir=str(tmp_path), utterances=30, pad_frames_to=32))
    train = task.train_batches(4, Shard(0, 1), seed=0)
    assert train.steps_per_epoch == 24 // 4
    first = next(iter(train))
    assert first["features"].shape[0] == 4 and first["features"].shape[1] % 32 == 0
    assert first["features"].shape[2] == num_features
    assert "texts" not in first and train.state() == {"epoch": 0, "index": 1}
    dev = list(task.eval_batches("dev", 2, Shard(0, 1)))
    assert sum(int(b["weights"].sum()) for b in dev) == 3  # every dev utterance once
    # two processes split each batch: together they see every utterance once
    halves = [list(task.eval_batches("dev", 2, Shard(i, 2))) for i in range(2)]
    assert sum(int(b["weights"].sum()) for part in halves for b in part) == 3
    variables = task.init(jax.random.PRNGKey(0))
    texts = task.transcribe(variables, [read_manifest(task.manifests["dev"])[0].audio_filepath])
    assert len(texts) == 1 and set(texts[0]) <= set(alphabet.SYMBOLS[1:])


def test_more_features_than_the_spectrogram_has_are_refused():
    model = config_lib.section_from_dict(ModelConfig, {**TINY_MODEL, "num_features": 200}, "model")
    with pytest.raises(ValueError, match="model.num_features must be at most 161"):
        DeepSpeech2Task(model, DataConfig())


def test_manifest_corpus_needs_its_manifests():
    with pytest.raises(ValueError, match="data.dev_manifest, data.test_manifest not set"):
        DataConfig(corpus="manifest", train_manifest="t.jsonl")


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[3] / "configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_config_validates(path):
    config = load_config(path)
    assert config.train.batch_size > 0 and config.model.conv_layers >= 1


def test_augmentation_changes_the_training_loss_not_predictions(task):
    augmented = DeepSpeech2Task(task.model_config, DataConfig(), AugmentConfig(warp=0.2, freq_masks=2, time_masks=2))
    variables = task.init(jax.random.PRNGKey(0))
    batch = random_batch(np.random.default_rng(3), 4)
    stacked = jax.tree_util.tree_map(lambda x: x[None], batch)
    keys = jax.random.split(jax.random.PRNGKey(1), 1)

    def losses(t):
        return jax.pmap(lambda b, key: t.loss(variables, b, key)[0], axis_name="batch")(stacked, keys)[0]

    plain, with_augmentation = float(losses(task)), float(losses(augmented))
    assert np.isfinite(with_augmentation) and with_augmentation != pytest.approx(plain, rel=1e-3)
    np.testing.assert_array_equal(augmented.predict(variables, batch)["logits"], task.predict(variables, batch)["logits"])
