"""The character-level language model as a jaxring task (jaxring/engine/task.py).

A config names it `task: examples.charlm.task:CharLMTask`: scripts/train.py
puts the checkout on the Python path, so no PYTHONPATH is needed
(examples/charlm/charlm.yaml). Its sections are `data` and `model`.

Outside the engine (a benchmark of the step, say), the task's own members are
the whole model: `task = CharLMTask()`, `variables = jax.jit(task.init)(jax.random.key(seed))`,
`batch = next(iter(task.train_batches(batch_size, Shard(0, 1), seed)))` and
`loss, _ = task.loss(variables, batch, None)` (no dropout: the rng is unused).
"""

from __future__ import annotations

import dataclasses
import logging
import math

import jax.numpy as jnp
import numpy as np
import optax

from jaxring.engine.global_batches import GlobalBatches
from jaxring.engine.task import MetricNames, Shard

from .data import ALPHABET, make_splits, unigram_entropy
from .model import CharTransformer

log = logging.getLogger(__name__)  # scripts/train.py shows the task package's INFO lines on the console


@dataclasses.dataclass(frozen=True)
class DataConfig:
    chars: int = 500_000  # of generated text, all splits together (data.py's SPLIT_SHARES)
    seed: int = 0  # the grammar's: the same seed writes the same text on every machine

    def __post_init__(self):
        if not self.chars >= 10_000:
            raise ValueError(f"data.chars must be at least 10000 (dev and test get 5% each); got {self.chars!r}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    context: int = 64  # characters the model sees; each training example predicts this many
    width: int = 96  # d_model
    heads: int = 4  # attention heads; width must be a multiple of them
    layers: int = 4  # transformer blocks
    mlp_ratio: int = 4  # the feed-forward layer's width over d_model

    def __post_init__(self):
        for key in ("context", "width", "heads", "layers", "mlp_ratio"):
            if not (isinstance(getattr(self, key), int) and getattr(self, key) > 0):
                raise ValueError(f"model.{key} must be a positive integer; got {getattr(self, key)!r}")
        if self.width % self.heads:
            raise ValueError(f"model.width ({self.width}) must be a multiple of model.heads ({self.heads}): "
                             "each head gets width / heads dimensions")


class CharLMTask:
    config_sections = {"data": DataConfig, "model": ModelConfig}  # the engine calls CharLMTask(data=, model=)
    metrics = MetricNames(best="bits_per_char", plotted=("bits_per_char",), shown=("bits_per_char", "perplexity"),
                          label="dev bits per character")  # neither is a rate: printed as plain numbers

    def __init__(self, data: DataConfig = DataConfig(), model: ModelConfig = ModelConfig()):
        self.context = model.context
        self.splits = make_splits(data.chars, data.seed)
        shortest = min(self.splits, key=lambda split: len(self.splits[split]))
        if len(self.splits[shortest]) <= model.context:
            raise ValueError(f"the {shortest} split's {len(self.splits[shortest])} characters hold no window of "
                             f"model.context + 1 = {model.context + 1}: raise data.chars or lower model.context")
        self.network = CharTransformer(len(ALPHABET), model.context, model.width, model.heads, model.layers,
                                       model.mlp_ratio)
        log.info("charlm: %s characters of %d symbols; unigram entropy of train %.3f bits per character",
                 ", ".join(f"{len(codes)} {name}" for name, codes in self.splits.items()), len(ALPHABET),
                 unigram_entropy(self.splits["train"]))

    def init(self, rng) -> dict:
        return self.network.init(rng, jnp.zeros((1, self.context), jnp.int32))

    def _nats_per_position(self, variables, tokens):
        """(rows, context): each position's negative log-likelihood (nats) of the character after it."""
        logits = self.network.apply(variables, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])

    def loss(self, variables, batch, rng):
        return self._nats_per_position(variables, batch["tokens"]).mean(), {}  # no non-param collections

    def predict(self, variables, batch):
        return self._nats_per_position(variables, batch["tokens"]).sum(axis=-1)  # per row: the sum stays exact

    def score(self, outputs, batch) -> dict[str, float]:
        tokens = batch["tokens"]
        return {"nats": math.fsum(np.asarray(outputs, np.float64)), "chars": float(tokens.size - len(tokens))}

    def summarize(self, counts):
        bits = counts["nats"] / counts["chars"] / math.log(2)
        return {"bits_per_char": bits, "perplexity": 2.0**bits}  # perplexity per character

    def train_batches(self, batch_size: int, shard: Shard, seed: int):
        return WindowBatches(self.splits["train"], self.context, batch_size, shard, seed)

    def eval_batches(self, split: str, batch_size: int, shard: Shard, limit: int | None):
        codes = self.splits[split]
        starts = np.arange(0, len(codes) - self.context, self.context)[:limit][shard.index :: shard.count]
        for first in range(0, len(starts), batch_size):
            yield {"tokens": windows(codes, starts[first : first + batch_size], self.context)}


def windows(codes: np.ndarray, starts: np.ndarray, context: int) -> np.ndarray:
    """int32 (len(starts), context + 1): the characters from each start, the last one only a target."""
    return codes[starts[:, None] + np.arange(context + 1)].astype(np.int32)


class WindowBatches(GlobalBatches):
    """This process's batches of windows of the training text. Every epoch shifts the windows by an offset
    under `context` and shuffles them (both from the seed and the epoch)."""

    def __init__(self, codes: np.ndarray, context: int, batch_size: int, shard: Shard, seed: int):
        windows_per_epoch = (len(codes) - context) // context  # each fits at every offset
        super().__init__(windows_per_epoch, batch_size, shard,
                         f"the training text's {windows_per_epoch} windows of {context + 1} characters", "data.chars")
        self.codes, self.context, self.seed, self.windows_per_epoch = codes, context, seed, windows_per_epoch

    def epoch_order(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng((self.seed, epoch))
        return rng.integers(self.context) + self.context * rng.permutation(self.windows_per_epoch)

    def batch(self, part: np.ndarray) -> dict:
        return {"tokens": windows(self.codes, part, self.context)}
