"""examples/charlm: a character-level transformer language model trained by scripts/train.py on text from a
seeded grammar; its metrics (bits per character, perplexity) checked against float64 numpy."""

import collections
import hashlib
import json
import math
import sys

import jax
import numpy as np
import pytest

from jaxring.engine.task import Shard
from tests.tiny_runs import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

import train  # noqa: E402
from examples.charlm import data  # noqa: E402
from examples.charlm.task import CharLMTask, DataConfig, ModelConfig  # noqa: E402

CONFIG = ROOT / "examples" / "charlm" / "charlm.yaml"
TINY_DATA = DataConfig(chars=10_000, seed=3)
TINY_MODEL = ModelConfig(context=16, width=32, heads=2, layers=1, mlp_ratio=2)
TINY = {"data.chars": TINY_DATA.chars, "data.seed": TINY_DATA.seed, "model.context": TINY_MODEL.context,
        "model.width": TINY_MODEL.width, "model.heads": TINY_MODEL.heads, "model.layers": TINY_MODEL.layers,
        "model.mlp_ratio": TINY_MODEL.mlp_ratio}


def test_the_text_is_the_same_on_every_machine():
    """Pinned characters: a change of the grammar or of Python's random shows here."""
    text = data.make_text(2000, seed=0)
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == "5858b63b755ef527", text[:200]
    assert text.startswith("One small brave queen sees the dogs. The small fox chases this empty old wolf.")
    assert set(text) <= set(data.ALPHABET) and len(data.ALPHABET) < 100


def test_each_split_is_its_own_text_and_the_unigram_entropy_is_the_characters():
    splits = data.make_splits(TINY_DATA.chars, TINY_DATA.seed)
    for split, codes in splits.items():
        text = "".join(data.ALPHABET[code] for code in codes)
        assert text == data.make_text(math.ceil(data.SPLIT_SHARES[split] * TINY_DATA.chars), f"3/{split}")
        assert text.endswith("\n") and len(text) >= data.SPLIT_SHARES[split] * TINY_DATA.chars
    train_text = "".join(data.ALPHABET[code] for code in splits["train"])
    counts = collections.Counter(train_text).values()
    expected = -math.fsum(n / len(train_text) * math.log2(n / len(train_text)) for n in counts)
    assert data.unigram_entropy(splits["train"]) == pytest.approx(expected, rel=1e-12)
    assert 3.5 < expected < math.log2(len(data.ALPHABET))


def test_each_global_batch_is_the_same_whatever_the_process_count():
    """global_order: the processes' slices of a global batch of 12, over 1, 2 or 3 processes, and after a resume."""
    task = CharLMTask(TINY_DATA, TINY_MODEL)

    def global_batches(count, steps=4, state=None):
        shards = [task.train_batches(12 // count, Shard(index, count), seed=5) for index in range(count)]
        for batches in shards if state else ():
            batches.restore(state)
        streams = [iter(batches) for batches in shards]
        return [np.concatenate([next(stream)["tokens"] for stream in streams]) for _ in range(steps)]

    alone = global_batches(1, steps=6)
    assert alone[0].shape == (12, TINY_MODEL.context + 1) and alone[0].dtype == np.int32
    for count in (2, 3):
        assert all(np.array_equal(a, b) for a, b in zip(alone, global_batches(count, steps=6)))
    resumed = global_batches(2, steps=2, state={"epoch": 0, "step": 4})
    assert all(np.array_equal(a, b) for a, b in zip(alone[4:], resumed))
    text = task.splits["train"]
    starts = [np.flatnonzero(np.all(np.lib.stride_tricks.sliding_window_view(text, 17) == row, axis=1))
              for row in alone[0][:3]]
    assert all(len(found) >= 1 for found in starts)  # each row is a window of the training text


def test_bits_per_char_is_the_float64_mean_negative_log2_likelihood():
    task = CharLMTask(TINY_DATA, TINY_MODEL)
    variables = jax.jit(task.init)(jax.random.key(1))
    predict, logits_of = jax.jit(task.predict), jax.jit(task.network.apply)
    (batch,) = task.eval_batches("dev", batch_size=1000, shard=Shard(0, 1), limit=None)  # one compile each
    counts = task.score(np.asarray(predict(variables, batch)), batch)
    logits = np.asarray(logits_of(variables, batch["tokens"][:, :-1]), np.float64)
    largest = logits.max(-1, keepdims=True)
    log_probs = logits - largest - np.log(np.exp(logits - largest).sum(-1, keepdims=True))
    nats = -np.take_along_axis(log_probs, batch["tokens"][:, 1:, None], -1).ravel()
    assert counts["chars"] == len(nats) == (len(task.splits["dev"]) - 1) // 16 * 16
    expected_bits = math.fsum(nats) / len(nats) / math.log(2)
    metrics = task.summarize(counts)
    assert metrics["bits_per_char"] == pytest.approx(expected_bits, rel=1e-5)
    assert metrics["perplexity"] == pytest.approx(2**expected_bits, rel=1e-5)


def test_bad_model_settings_are_refused_by_name():
    with pytest.raises(ValueError, match=r"the dev split's \d+ characters hold no window of model.context \+ 1 = 1025"):
        CharLMTask(TINY_DATA, ModelConfig(context=1024))
    with pytest.raises(ValueError, match=r"model.width \(30\) must be a multiple of model.heads \(4\)"):
        ModelConfig(width=30, heads=4)
    with pytest.raises(ValueError, match="model.layers must be a positive integer; got 0"):
        ModelConfig(layers=0)


def test_the_config_trains_a_tiny_model_and_reports_bits_per_char(tmp_path, capsys):
    """The example's own config, shrunk: the loss falls, dev and test are scored, and the last line shows bits
    per character as a plain number (not a percentage)."""
    overrides = {**TINY, "train.batch_size": 16, "train.max_steps": 40, "train.log_every": 1,
                 "optim.warmup_steps": 4, "optim.learning_rate": 0.01, "eval.every_steps": 20}
    summary = train.main(["--config", str(CONFIG), "--workdir", str(tmp_path / "run"),
                          *[arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]])
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if "loss" in row]
    assert len(losses) == 40 and np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5]), losses
    dev = [row["dev_bits_per_char"] for row in rows if "dev_bits_per_char" in row]
    assert len(dev) == 2 and dev[-1] < dev[0]
    unigram = data.unigram_entropy(data.make_splits(TINY_DATA.chars, TINY_DATA.seed)["train"])
    assert summary["test_bits_per_char"] < unigram and summary["test_perplexity"] == 2 ** summary["test_bits_per_char"]
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert last_line.startswith(f"test bits_per_char {summary['test_bits_per_char']:.4g}, perplexity "), last_line
    assert "%, " not in last_line.split(";")[0]
