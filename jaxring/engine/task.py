"""The contract between the engine and a model: what a task brings, and the names they share.

Models and scripts import this module, never the trainer, to implement a task.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, ClassVar, Iterable, Iterator, Mapping, NamedTuple, Protocol

import jax

AXIS = "batch"  # the pmapped axis: local devices
# A batch may hold, under this key, a list naming where each of its examples came
# from (file paths); the engine takes it out before the step and names them when
# the step's loss is not finite.
SOURCES = "sources"


class DataError(ValueError):
    """Data a task cannot use; the message names where and why (scripts/train.py prints it as one line)."""


class Shard(NamedTuple):
    """This process's share of the data: shard `index` of `count`."""

    index: int
    count: int


class Batches(Protocol):
    """This process's training batches, epoch after epoch, with a resumable position."""

    steps_per_epoch: int
    # Optional: True where the batches are this process's slices of one sequence of global batches that depends
    # on the seed and the global batch size alone (not on shard.count), and state() is a position in it. Only
    # then may a run resume on another number of processes (jaxring/engine/run_shape.py, resume_note).
    global_order: bool = False

    def __iter__(self) -> Iterator[dict]: ...

    def state(self) -> dict:
        """JSON-serialisable position: after restore(), iteration yields the batches that would have come next."""

    def restore(self, state: dict) -> None: ...


@dataclasses.dataclass(frozen=True)
class MetricNames:
    """How the engine reports a task's evaluation metrics: keys of `Task.summarize`, lower is better."""

    best: str  # the dev metric that selects the best checkpoint (unless checkpoint.best_metric says otherwise)
    plotted: tuple[str, ...]  # drawn together in the run's plots/dev_metrics.png
    shown: tuple[str, ...]  # in the progress bar
    label: str = "dev metric"  # the y axis of plots/dev_metrics.png
    percent: tuple[str, ...] = ()  # the metrics that are rates (shares of 1): printed as percentages

    @property
    def names(self) -> tuple[str, ...]:
        """Every metric named here: what checkpoint.best_metric may pick."""
        return tuple(dict.fromkeys((self.best, *self.plotted, *self.shown, *self.percent)))

    def format(self, name: str, value: float, decimals: int = 2) -> str:
        """`value` of metric `name` as the task declares it: a rate as a percentage, else 4 significant digits."""
        return f"{100 * value:.{decimals}f}%" if name in self.percent else f"{value:.4g}"


class Task(Protocol):
    """What a model brings to the engine. Batches are dicts of numpy arrays, leading axis = examples.

    jaxring/engine/registry.py finds a task class by the config's `task:` key and
    checks it has every member below with these arguments before anything runs.
    Required: `metrics` and the seven methods up to `eval_batches`. Optional,
    with the default named: `config_sections`, `from_config`, `check_data`,
    `final_report`, `optimizer`, and scripts/evaluate.py's
    `add_evaluate_arguments` and `evaluate`.
    """

    metrics: MetricNames

    # Optional: the task's own config sections, by name, as dataclasses (the
    # engine's are train, optim, eval, checkpoint). Default: none.
    config_sections: ClassVar[Mapping[str, type]] = types.MappingProxyType({})

    @classmethod
    def from_config(cls, config) -> Task:
        """Optional: the task a resolved config (jaxring.engine.config.Config) describes.
        Default: the class called with each of its config sections by name."""
        return cls(**{name: config.sections[name] for name in getattr(cls, "config_sections", {})})

    def init(self, rng) -> dict:
        """Flax variables: "params" (float32) and any other collections (e.g. "batch_stats"), nested dicts of
        numeric arrays, a PRNG key as its key data; checked before the first step (engine/initial_state.py).
        An nnx.Module's: subclass jaxring.engine.nnx_task.NNXTask."""

    def loss(self, variables: dict, batch: dict, rng) -> tuple[jax.Array, dict]:
        """(mean loss of a device batch, updated non-param collections), training mode, inside pmap over AXIS.

        The pair is required even without model state: return (loss, {}). `rng` is this replica's for this
        step. Of the collections returned, the step averages the floating-point leaves over every replica
        (statistics); integer, boolean and key-data leaves are never averaged: each replica keeps its own,
        and a checkpoint holds the first device's, so they must advance alike (engine/model_state.py)."""

    def predict(self, variables: dict, batch: dict) -> Any:
        """Evaluation-mode outputs, every leaf with a leading batch axis; inside pmap over AXIS."""

    def score(self, outputs: Any, batch: dict) -> dict[str, float]:
        """Additive counts (e.g. edit distances and lengths) for host numpy outputs of `batch`."""

    def summarize(self, counts: dict[str, float]) -> dict[str, float]:
        """Metrics named by `metrics` (lower is better) from summed counts."""

    def train_batches(self, batch_size: int, shard: Shard, seed: int) -> Batches:
        """This process's share (`shard`) of the training data, `batch_size` examples a batch."""

    def eval_batches(self, split: str, batch_size: int, shard: Shard, limit: int | None) -> Iterable[dict]:
        """Batches of split "dev" or "test" (this process's share), the first `limit` examples (None: all)."""

    def check_data(self) -> dict:
        """Optional, for a task with data files: reads every split before the first step, raises
        ValueError naming what makes a split unusable, and returns a JSON-serialisable report by
        split of what it skipped, each with a one-line "summary" (the trainer prints those and
        writes the report to WORKDIR/data_report.json). Default: no check (None)."""
        return None

    def final_report(self, config, workdir, summary: dict) -> tuple[dict, str]:
        """Optional, for a task that scores more once training ends (a slower decoder, say): called
        on the lead process after Trainer.fit with its summary (the best checkpoint is in WORKDIR);
        returns entries to add to summary.json and the result text that begins the run's last line.
        Default: the line shows the metrics `metrics` names (jaxring/engine/report.py, which adds
        the devices, processes, all-reduce share and time to either), as for an empty text."""
        return {}, ""

    # Optional, for scripts/evaluate.py (jaxring/engine/launch.py), which scores a run again: a task with
    # options of its own (Deep Speech 2: a manifest, a beam search with an LM) has both of these. Default:
    # no options, and the split (--split dev or test) scored as training scores it
    # (jaxring/engine/evaluation.py's score_split).

    @staticmethod
    def add_evaluate_arguments(parser) -> None:
        """Adds the task's options to evaluate.py's argparse parser (it has --workdir, --split,
        --checkpoint, --batch-size)."""
        return None

    # optimizer(self, schedule) -> optax.GradientTransformation: optional, the task's own optimizer in place of
    # optim.name's, given the engine's learning-rate schedule (jaxring/engine/own_optimizer.py). Not declared
    # here, as evaluate below: the engine tells a task with one from one without.

    # evaluate(self, args, config, variables) -> tuple[dict, str | None]: (JSON-serialisable scores of
    # `variables` as `args` ask, an error to end with once they are printed, or None); raises ValueError
    # (DataError) for options or data it cannot score. Not declared here: the default lives in the engine,
    # which this module does not import, and a subclass must not inherit an empty one.
