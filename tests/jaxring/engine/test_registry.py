"""The task registry (jaxring/engine/registry.py): the three ways to name a task, the errors when none
resolves, and the contract checked on the class with every problem named."""

import dataclasses
import sys

import jax.numpy as jnp
import pytest

from jaxring.engine import config as config_lib
from jaxring.engine import registry
from jaxring.engine import trainer as trainer_lib
from jaxring.engine.experiment import build_task, load_config
from jaxring.engine.report import final_report
from jaxring.engine.task import MetricNames, Task
from tests.jaxring.engine.toy_task import ToyTask, toy_config, world_of


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package `mytasks` in a folder on the Python path, as a user's own would be."""
    (tmp_path / "mytasks").mkdir()
    (tmp_path / "mytasks" / "__init__.py").write_text("")
    (tmp_path / "mytasks" / "toy.py").write_text("from tests.jaxring.engine.toy_task import ToyTask\n"
                                                 "class Helper:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [name for name in sys.modules if name.startswith("mytasks")]:
        del sys.modules[name]


def test_an_import_path_names_a_class_on_the_python_path(package):
    assert registry.task_class("mytasks.toy:ToyTask") is ToyTask


def test_an_installed_packages_entry_point_names_a_task(package):
    info = package / "mytasks-1.0.dist-info"  # what pip writes for a package declaring the entry point
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mytasks\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[jaxring.tasks]\ntoy = mytasks.toy:ToyTask\n")
    assert registry.registered()["toy"] == "mytasks.toy:ToyTask"
    assert registry.task_class("toy") is ToyTask


def test_a_registered_name_wins_and_deepspeech2_is_registered_so(monkeypatch):
    import models  # noqa: F401  (registers deepspeech2)

    toy = "tests.jaxring.engine.toy_task:ToyTask"
    monkeypatch.setattr(registry, "_registered", {**registry._registered, "toy": toy})
    assert registry.task_class("toy") is ToyTask
    assert registry.registered()["deepspeech2"] == "models.deepspeech2.task:DeepSpeech2Task"
    with pytest.raises(ValueError, match="must be an import path 'package.module:Class'"):
        registry.register("mlp", "mypkg.MLPTask")


def test_a_name_that_resolves_to_nothing_says_what_was_tried_and_how_to_register():
    with pytest.raises(config_lib.ConfigError) as error:
        registry.task_class("mlp")
    message = str(error.value)
    assert "unknown task 'mlp': it is not registered (registered tasks: " in message
    assert "package.module:Class" in message and "'jaxring.tasks'" in message and "register(name" in message


def test_an_import_path_that_does_not_import_names_the_module_or_the_classes_it_has(package):
    with pytest.raises(config_lib.ConfigError, match=r"cannot import module 'mytasks\.nothere' .*PYTHONPATH"):
        registry.task_class("mytasks.nothere:Task")
    with pytest.raises(config_lib.ConfigError, match=r"has no 'ToyTsk'; its classes: Helper"):
        registry.task_class("mytasks.toy:ToyTsk")


@dataclasses.dataclass(frozen=True)
class Section:
    width: int = 3


class Broken:
    """Each member the engine calls, missing or wrongly shaped."""

    metrics = ("loss",)
    config_sections = {"train": Section, "data": dict}

    def init(self, rng):
        pass

    def loss(self, batch):  # lacks variables and rng
        pass

    score = summarize = train_batches = eval_batches = lambda self, *a: None

    def final_report(self):
        pass


def test_the_class_is_checked_and_every_problem_named():
    with pytest.raises(config_lib.ConfigError) as error:
        registry.check_task_class(Broken)
    message = str(error.value)
    assert "Broken does not meet the Task contract (jaxring/engine/task.py)" in message
    assert "missing method predict(self, variables, batch)" in message
    assert "loss(self, batch) cannot be called as loss(self, variables, batch, rng)" in message
    assert "final_report(self) cannot be called as final_report(self, config, workdir, summary)" in message
    assert "config_sections names 'train', which the engine owns" in message
    assert "config_sections['data'] must be a dataclass" in message
    assert "metrics must be a jaxring.engine.task.MetricNames; got tuple" in message
    registry.check_task_class(ToyTask)  # the whole contract, without the optional members


class Minimal(Task):
    """Only what the contract requires, and one section: the defaults do the rest."""

    metrics = MetricNames(best="mse", plotted=("mse",), shown=("mse",))
    config_sections = {"toy": Section}

    def __init__(self, toy):
        self.toy, self.inner = toy, ToyTask()

    def init(self, rng):
        return self.inner.init(rng)

    def loss(self, variables, batch, rng):
        return self.inner.loss(variables, batch, rng)

    def predict(self, variables, batch):
        return self.inner.predict(variables, batch)

    def score(self, outputs, batch):
        return self.inner.score(outputs, batch)

    def summarize(self, counts):
        return self.inner.summarize(counts)

    def train_batches(self, batch_size, shard, seed):
        return self.inner.train_batches(batch_size, shard, seed)

    def eval_batches(self, split, batch_size, shard, limit):
        return self.inner.eval_batches(split, batch_size, shard, limit)


def test_a_subclass_of_task_without_a_required_method_is_refused_though_it_inherits_the_stub():
    class NoPredict(Minimal):
        predict = Task.predict

    with pytest.raises(config_lib.ConfigError, match=r"NoPredict does not meet .*: missing method predict\(self, "
                                                     r"variables, batch\)$"):
        registry.check_task_class(NoPredict)


def test_a_minimal_task_gets_the_optional_members_defaults(tmp_path):
    registry.check_task_class(Minimal)
    config = config_lib.build({"toy": {"width": 5}, **toy_config().to_dict()}, registry.config_sections(Minimal))
    task = registry.build_task(Minimal, config)
    assert task.toy == Section(5)  # from_config's default: the class called with its sections
    summary = trainer_lib.Trainer(task, config, tmp_path, world_of(2)).fit()
    assert summary["steps"] == 12 and not (tmp_path / "data_report.json").exists()  # check_data's default: none
    _, line = final_report(task, config, tmp_path, summary, "cpu")  # final_report's default: the metrics line
    # mse is not a rate (ToyTask's MetricNames.percent is empty): written as it is, not as a percentage.
    assert line.startswith(f"test mse {summary['test_mse']:.4g}; dev mse {summary['dev_mse']:.4g} (checkpoint")


class LossAlone(ToyTask):
    def loss(self, variables, batch, rng):
        return super().loss(variables, batch, rng)[0]


def test_a_loss_without_its_aux_is_refused_saying_what_the_contract_wants(tmp_path):
    trainer = trainer_lib.Trainer(LossAlone(), toy_config(), tmp_path, world_of(2))
    with pytest.raises(TypeError, match=r"LossAlone.loss must return \(loss, aux\): .*; got one array of shape \(\)\n"):
        trainer.fit()
    with pytest.raises(TypeError, match=r"must return \(loss, aux\).*got a pair whose loss has shape \(3,\)"):
        registry.checked_loss(ToyTask(), (jnp.ones(3), {}))


def test_a_task_built_without_the_registry_is_checked_too(tmp_path):
    class NoPredict(ToyTask):
        predict = None

    with pytest.raises(config_lib.ConfigError, match="predict must be a method predict"):
        trainer_lib.Trainer(NoPredict(), toy_config(), tmp_path, world_of(2))


def test_a_config_names_a_task_without_sections_by_its_import_path(tmp_path):
    path = tmp_path / "toy.yaml"
    path.write_text("task: tests.jaxring.engine.toy_task:ToyTask\ntrain: {batch_size: 8}\n")
    config = load_config(path)
    assert set(config.sections) == {"train", "optim", "eval", "checkpoint"} and config.train.batch_size == 8
    assert type(build_task(config)) is ToyTask  # from_config's default: the class with no sections
    path.write_text("task: tests.jaxring.engine.toy_task:ToyTask\nmodel: {width: 3}\n")
    with pytest.raises(config_lib.ConfigError, match="unknown key 'model' in the config"):
        load_config(path)
