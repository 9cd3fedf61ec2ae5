"""A toy task for the engine's tests: y = tanh(x W1) W2 by squared error, and the configs and worlds to train it."""

import time
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np

from jaxring.engine import config as config_lib
from jaxring.engine.global_batches import GlobalBatches
from jaxring.engine.task import MetricNames

DIM = 5
HIDDEN = 8


class ToyBatches(GlobalBatches):
    """Seeded shuffles of a fixed data set, each batch `delay` seconds late."""

    def __init__(self, x, y, batch_size, shard, seed, delay=0.0):
        super().__init__(len(x), batch_size, shard, f"the toy task's {len(x)} rows", "ToyTask(rows=)")
        self.x, self.y, self.seed, self.delay = x, y, seed, delay

    def epoch_order(self, epoch):
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.x))

    def batch(self, part):
        time.sleep(self.delay)
        return {"x": self.x[part], "y": self.y[part]}


SPLITS = {"dev": slice(0, 40), "test": slice(40, 75)}  # odd sizes: padding is exercised


class ToyTask:
    """y = tanh(x W1) W2 by squared error, with a running input mean as non-param state."""

    metrics = MetricNames(best="mse", plotted=("mse",), shown=("mse",), label="dev mse")  # not a rate: no %

    def __init__(self, rows=96, delay=0.0, compute_dtype=jnp.float32):
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=(rows, DIM)).astype(np.float32)
        self.y = np.sin(self.x @ rng.normal(size=(DIM, 1))).astype(np.float32)
        self.delay = delay
        self.compute_dtype = compute_dtype

    def init(self, rng):
        k1, k2 = jax.random.split(rng)
        return {
            "params": {"w1": jax.random.normal(k1, (DIM, HIDDEN)) * 0.5,
                       "w2": jax.random.normal(k2, (HIDDEN, 1)) * 0.5},
            "stats": {"mean": jnp.zeros((DIM,))},
        }

    def _forward(self, params, x):
        cast = lambda a: a.astype(self.compute_dtype)  # noqa: E731
        return (jnp.tanh(cast(x) @ cast(params["w1"])) @ cast(params["w2"])).astype(jnp.float32)

    def loss(self, variables, batch, rng):
        error = self._forward(variables["params"], batch["x"]) - batch["y"]
        mean = 0.9 * variables["stats"]["mean"] + 0.1 * batch["x"].mean(0)
        return jnp.mean(error**2), {"stats": {"mean": mean}}

    def predict(self, variables, batch):
        return self._forward(variables["params"], batch["x"])

    def score(self, outputs, batch):
        return {"squared_error": float(np.sum((outputs - batch["y"]) ** 2)), "rows": len(batch["y"])}

    def summarize(self, counts):
        return {"mse": counts["squared_error"] / counts["rows"]}

    def train_batches(self, batch_size, shard, seed):
        return ToyBatches(self.x, self.y, batch_size, shard, seed, self.delay)

    def eval_batches(self, split, batch_size, shard, limit):
        x, y = self.x[SPLITS[split]][:limit], self.y[SPLITS[split]][:limit]
        for start in range(0, len(x), batch_size):
            yield {"x": x[start : start + batch_size], "y": y[start : start + batch_size]}


class LoudTask(ToyTask):
    """ToyTask with targets 300 times larger: float16's first loss scales overflow, so steps are skipped."""

    def __init__(self):
        super().__init__()
        self.y = self.y * 300


def with_train(sections: dict, **train) -> dict:
    """`sections` (toy_config's keyword arguments) with `train`'s keys set on top of its train section."""
    return {**sections, "train": {**sections.get("train", {}), **train}}


def toy_config(**sections):
    raw = {
        "train": {"batch_size": 8, "epochs": 1, "log_every": 2, "allreduce": "ring" if ring_available() else "psum"},
        "optim": {"name": "sgd", "learning_rate": 0.05, "momentum": 0.9, "clip_norm": 1.0},
        "eval": {"every_steps": 6, "batch_size": 16},
        "checkpoint": {"keep": 2},  # the best checkpoint by the task's metric, mse
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return config_lib.build(raw, {})


def world_of(n_devices):
    return SimpleNamespace(rank=0, size=1, local_devices=jax.local_devices()[:n_devices])


def ring_available():
    try:
        import jaxring

        return hasattr(jaxring, "tree_allreduce")
    except ImportError:
        return False


# test_trainer.py's run resumed by processes with separate disks, and its mpirun worker's (separate_disks_worker.py).
SEPARATE_DISKS_CONFIG = {"train": {"epochs": 2}, "checkpoint": {"every_steps": 4}, "eval": {"every_steps": 6}}

# test_resume_shapes.py's run, trained on one shape and resumed on others (also by its mpirun worker,
# shape_worker.py): two epochs, so a resume crosses an epoch boundary, and a schedule that is not constant.
SHAPE_CONFIG = {
    "train": {"epochs": 2},
    "optim": {"schedule": "warmup_cosine", "warmup_steps": 4, "final_learning_rate": 0.005},
    "checkpoint": {"every_steps": 5, "keep": 10},
    "eval": {"every_steps": 0},
}

# test_sharded_step.py's run under mpirun (sharded_worker.py) and its references: SHAPE_CONFIG with adamw
# and clipping (toy_config's).
SHARDED_CONFIG = {**SHAPE_CONFIG, "optim": {**SHAPE_CONFIG["optim"], "name": "adamw", "learning_rate": 0.01,
                                            "weight_decay": 0.05}}
# Its first steps again with train.allreduce_dtype bfloat16 (sharded_worker.wire_steps): the float32 run has a
# checkpoint there (every 5 steps).
WIRE_STEPS = 10

# test_sharded_step.py's float16 runs of LoudTask, in one process and under mpirun (sharded_worker.float16_steps):
# loss scaling, with lax's reduce-scatter and all-gather among each process' devices (train.allreduce psum).
FLOAT16_CONFIG = {"train": {"max_steps": 12, "compute_dtype": "float16", "bucket_bytes": 64, "allreduce": "psum"},
                  "optim": {"name": "adamw", "learning_rate": 0.01}}
