"""The NNX classifier as a jaxring task: NNXTask (jaxring/engine/nnx_task.py) makes the engine's init, loss
and predict from the three model methods below; the rest is examples/classifier's task.

A config names it `task: nnx_classifier.task:NNXClassifierTask` (examples/ on PYTHONPATH):
examples/nnx_classifier/nnx_classifier.yaml.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import optax
from flax import nnx

from jaxring.engine.nnx_task import NNXTask
from classifier.task import ClassifierTask, DataConfig
from nnx_classifier.model import MLP


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    hidden: tuple[int, ...] = (64,)  # the widths of the hidden layers
    dropout: float = 0.1  # the rate of nnx.Dropout after each hidden layer

    def __post_init__(self):
        if not 0 <= self.dropout < 1:
            raise ValueError(f"model.dropout must be in [0, 1); got {self.dropout!r}")


class NNXClassifierTask(NNXTask, ClassifierTask):
    config_sections = {"data": DataConfig, "model": ModelConfig}

    def __init__(self, data: DataConfig = DataConfig(), model: ModelConfig = ModelConfig()):
        super().__init__(data)
        self.model_config = model

    def create_model(self, rngs: nnx.Rngs) -> MLP:
        cfg = self.model_config
        return MLP(self.data.features, tuple(cfg.hidden), self.data.classes, cfg.dropout, rngs=rngs)

    def model_loss(self, model: MLP, batch):
        return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()

    def model_predict(self, model: MLP, batch):
        return jnp.argmax(model(batch["x"]), axis=-1)
