"""The classifier as a jaxring task (jaxring/engine/task.py): what the engine needs, nothing more.

A config names it `task: classifier.task:ClassifierTask` (examples/ on
PYTHONPATH) and has its two sections, `data` and `model`, besides the
engine's: examples/classifier/classifier.yaml.
"""

from __future__ import annotations

import dataclasses
import logging

import jax.numpy as jnp
import numpy as np
import optax

from jaxring.engine.global_batches import GlobalBatches
from jaxring.engine.task import MetricNames, Shard
from classifier.data import make_clusters
from classifier.model import MLP

log = logging.getLogger(__name__)  # scripts/train.py shows the task package's INFO lines on the console


@dataclasses.dataclass(frozen=True)
class DataConfig:
    examples: int = 4096  # all splits together: 80% train, 10% dev, 10% test
    features: int = 16  # inputs per example
    classes: int = 4  # at least 2
    spread: float = 0.3  # the noise around each class's centre (centres are about 1.4 apart)
    seed: int = 0  # the data's: the same seed makes the same examples on every machine

    def __post_init__(self):
        for key in ("examples", "features", "classes", "spread"):
            if not getattr(self, key) > 0:
                raise ValueError(f"data.{key} must be positive; got {getattr(self, key)!r}")
        if self.classes < 2:
            raise ValueError(f"data.classes must be at least 2; got {self.classes}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    hidden: tuple[int, ...] = (64,)  # the widths of the hidden layers


class ClassifierTask:
    config_sections = {"data": DataConfig, "model": ModelConfig}  # the engine calls ClassifierTask(data=, model=)
    metrics = MetricNames(best="error_rate", plotted=("error_rate",), shown=("error_rate",),
                          label="dev error rate (%)", percent=("error_rate",))

    def __init__(self, data: DataConfig = DataConfig(), model: ModelConfig = ModelConfig()):
        self.data = data
        self.splits = make_clusters(data.examples, data.features, data.classes, data.spread, data.seed)
        self.network = MLP(tuple(model.hidden), data.classes)
        log.info("classifier: %s", ", ".join(f"{len(s['y'])} {name} examples" for name, s in self.splits.items()))

    def init(self, rng) -> dict:
        return self.network.init(rng, jnp.zeros((1, self.data.features)))

    def loss(self, variables, batch, rng):
        logits = self.network.apply(variables, batch["x"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
        return loss, {}  # (loss, the updated non-param collections): an MLP has none

    def predict(self, variables, batch):
        return jnp.argmax(self.network.apply(variables, batch["x"]), axis=-1)

    def score(self, outputs, batch) -> dict[str, float]:
        return {"errors": float(np.sum(outputs != batch["y"])), "examples": float(len(batch["y"]))}

    def summarize(self, counts):
        return {"error_rate": counts["errors"] / counts["examples"]}

    def train_batches(self, batch_size: int, shard: Shard, seed: int):
        return ShuffledBatches(self.splits["train"], batch_size, shard, seed)

    def eval_batches(self, split: str, batch_size: int, shard: Shard, limit: int | None):
        rows = {key: values[:limit][shard.index :: shard.count] for key, values in self.splits[split].items()}
        for start in range(0, len(rows["y"]), batch_size):
            yield {key: values[start : start + batch_size] for key, values in rows.items()}


class ShuffledBatches(GlobalBatches):
    """This process's batches: every epoch a new order of the training split (from the seed and the epoch)."""

    def __init__(self, split: dict, batch_size: int, shard: Shard, seed: int):
        super().__init__(len(split["y"]), batch_size, shard, f"the training split's {len(split['y'])} examples",
                         "data.examples")
        self.split, self.seed = split, seed

    def epoch_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng((self.seed, epoch)).permutation(len(self.split["y"]))

    def batch(self, part: np.ndarray) -> dict:
        return {key: values[part] for key, values in self.split.items()}
