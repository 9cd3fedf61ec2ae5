"""Config schema: typed sections, closest-key errors, typed --set overrides, round trip."""

import dataclasses
import os
import re
from pathlib import Path

import pytest
import yaml

from jaxring.engine import config as config_lib
from jaxring.engine.task import MetricNames


@dataclasses.dataclass(frozen=True)
class DataSection:
    corpus: str = "synthetic"
    utterances: int = 100
    max_seconds: float | None = None
    splits: tuple[str, ...] = ("train", "dev")


@dataclasses.dataclass(frozen=True)
class ModelSection:
    width: int = 4

    def __post_init__(self):
        if self.width < 1:
            raise ValueError(f"model.width must be at least 1; got {self.width}")


TASK = {"data": DataSection, "model": ModelSection}


def test_defaults_and_types():
    cfg = config_lib.build({"optim": {"learning_rate": 1}, "data": {"max_seconds": 3}}, TASK)
    assert cfg.optim.learning_rate == 1.0 and isinstance(cfg.optim.learning_rate, float)
    assert cfg.data.max_seconds == 3.0 and cfg.train == config_lib.TrainConfig()
    assert cfg.model == ModelSection() and cfg.task is None


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"optim": {"learnin_rate": 0.1}}, "unknown key 'learnin_rate' in optim; did you mean 'learning_rate'"),
        ({"trian": {}}, "unknown key 'trian' in the config; did you mean 'train'"),
        ({"data": {"utterance": 3}}, "did you mean 'utterances'"),
        ({"train": {"batch_size": "big"}}, "train.batch_size must be int; got str 'big'"),
        ({"train": {"batch_size": 2.5}}, "train.batch_size must be int"),
        ({"train": {"allreduce": "nccl"}}, "train.allreduce must be one of ring, psum; got 'nccl'"),
        ({"train": {"allreduce_dtype": "int8"}}, "train.allreduce_dtype must be one of bfloat16, float16, float32; got 'int8'"),
        ({"train": {"across_processes": "gloo"}}, "train.across_processes must be one of jaxring, mpi4jax; got 'gloo'"),
        ({"train": {"across_processes": "mpi4jax", "shard_optimizer": True}},
         "train.shard_optimizer: true needs train.across_processes: jaxring"),
        ({"train": {"batch_size": 0}}, "train.batch_size must be positive"),
        ({"data": {"splits": "train"}}, "data.splits must be a list"),
        ({"model": {"widht": 3}}, "unknown key 'widht' in model; did you mean 'width'"),
        ({"model": {"width": 0}}, "model.width must be at least 1; got 0"),
        ({"task": 3}, "task must be the name of a registered task; got 3"),
        ({"optim": [1, 2]}, "optim must be a mapping"),
        ({"train": {"epochs": 0}}, "train.epochs must be positive (leave at least one step); got 0"),
        ({"train": {"max_steps": 0}}, "train.max_steps must be positive (leave at least one step, or null"),
        ({"train": {"max_steps": -3}}, "train.max_steps must be positive (leave at least one step, or null"),
        ({"train": {"epochs": 1.5}}, "train.epochs must be int; got float 1.5"),
        ({"train": {"bucket_bytes": 0}}, "train.bucket_bytes must be positive"),
        ({"eval": {"batch_size": 0}}, "eval.batch_size must be positive; got 0"),
        ({"eval": {"every_steps": -1}}, "eval.every_steps must be 0 (off) or a positive number of steps; got -1"),
        ({"eval": {"max_examples": 0}}, "eval.max_examples must be positive (or null to score the whole dev"),
        ({"checkpoint": {"every_steps": -5}}, "checkpoint.every_steps must be 0 (off) or a positive number"),
        ({"checkpoint": {"keep": 0}}, "checkpoint.keep must be positive"),
        ({"optim": {"learning_rate": float("nan")}}, "optim.learning_rate must be positive; got nan"),
    ],
)
def test_bad_configs_name_the_problem(raw, message):
    with pytest.raises(config_lib.ConfigError, match=re.escape(message)):
        config_lib.build(raw, TASK)


def test_overrides_are_typed_by_the_schema():
    cfg = config_lib.build(
        {"optim": {"learning_rate": 0.5}},
        TASK,
        [
            "optim.learning_rate=1e-3",  # YAML alone would read this as a string
            "train.batch_size=16",
            "optim.nesterov=false",
            "optim.clip_norm=null",
            "data.corpus=123",  # a str field keeps the text
            "data.splits=[train, test]",
            "train.max_steps=7",
            "model.width=5",
        ],
    )
    assert cfg.optim.learning_rate == 1e-3 and cfg.train.batch_size == 16
    assert cfg.optim.nesterov is False and cfg.optim.clip_norm is None
    assert cfg.data.corpus == "123" and cfg.data.splits == ("train", "test")
    assert cfg.train.max_steps == 7 and cfg.model.width == 5


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.learning_rate", "section.key=value"),
        ("lr=1", "section.key=value"),
        ("optim.lr=1", "did you mean 'learning_rate'"),
        ("optimizer.learning_rate=1", "did you mean 'optim'"),
        ("train.batch_size=eight", "--set train.batch_size: expected int; got 'eight'"),
        ("optim.nesterov=maybe", "expected true or false"),
        ("optim.name=lamb", "optim.name must be one of sgd, adamw; got 'lamb'"),
        ("optim.schedule=cyclic", "optim.schedule must be one of anneal, warmup_cosine, constant"),
    ],
)
def test_bad_overrides(override, message):
    with pytest.raises(config_lib.ConfigError, match=message.replace(".", r"\.")):
        config_lib.build({}, TASK, [override])


def test_a_bad_override_is_blamed_on_the_command_line_not_the_file(tmp_path):
    source = tmp_path / "exp.yaml"
    source.write_text(yaml.safe_dump({"task": "toy", "train": {"epochs": 3}}))
    for override, message in (("optim.lr=1e-3", "--set optim.lr=1e-3: unknown key 'lr' in optim; did you mean"),
                              ("optimizer.lr=1", "--set optimizer.lr=1: unknown key 'optimizer' in the config"),
                              ("train.epochs=two", "--set train.epochs: expected int; got 'two'")):
        with pytest.raises(config_lib.ConfigError) as refused:
            config_lib.load(source, TASK, [override])
        assert str(refused.value).startswith(message) and "exp.yaml" not in str(refused.value)
    source.write_text(yaml.safe_dump({"task": "toy", "optim": {"lr": 1e-3}}))
    with pytest.raises(config_lib.ConfigError, match=r"exp\.yaml: unknown key 'lr' in optim"):
        config_lib.load(source, TASK, ["optim.learning_rate=1e-3"])


def test_saved_config_loads_back_identical(tmp_path):
    source = tmp_path / "exp.yaml"
    source.write_text(yaml.safe_dump({"task": "toy", "train": {"epochs": 3}, "data": {"utterances": 7}, "model": {"width": 2}}))
    cfg = config_lib.load(source, TASK, ["optim.name=adamw"])
    config_lib.save(cfg, tmp_path / "config.yaml")
    again = config_lib.load(tmp_path / "config.yaml", TASK)
    assert again.to_dict() == cfg.to_dict()
    assert again.optim.name == "adamw" and again.train.epochs == 3 and again.data.utterances == 7
    assert again.task == "toy" and config_lib.task_name(tmp_path / "config.yaml") == "toy"


def test_missing_file_and_file_name_in_errors(tmp_path):
    with pytest.raises(config_lib.ConfigError, match="does not exist"):
        config_lib.load(tmp_path / "nope.yaml", TASK)
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  epoch: 3\n")
    with pytest.raises(config_lib.ConfigError, match=r"bad\.yaml: unknown key 'epoch' in train; did you mean 'epochs'"):
        config_lib.load(bad, TASK)


@dataclasses.dataclass(frozen=True)
class FilesSection:
    cache_dir: config_lib.ConfigPath = "data/cache"
    manifest: config_lib.ConfigPath | None = None
    note: str = "data/not-a-path"


def test_paths_in_a_file_resolve_against_the_named_folder_whatever_the_cwd(tmp_path, monkeypatch):
    source = tmp_path / "configs" / "exp.yaml"
    source.parent.mkdir()
    source.write_text(yaml.safe_dump({"files": {"manifest": "../lists/train.jsonl", "note": "x/y"}}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    repo = tmp_path / "repo"
    cfg = config_lib.load(source, {"files": FilesSection}, paths_relative_to=repo)
    assert cfg.files.cache_dir == str(repo / "data" / "cache")  # defaults too
    assert cfg.files.manifest == str(tmp_path / "lists" / "train.jsonl")
    assert cfg.files.note == "x/y"  # a plain str is not a path
    config_lib.save(cfg, tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())["files"]
    # Inside the folder paths resolve against: relative to it again; outside: absolute.
    assert saved["cache_dir"] == os.path.join("data", "cache") and saved["manifest"] == cfg.files.manifest
    moved = tmp_path / "moved_repo"
    again = config_lib.load(tmp_path / "config.yaml", {"files": FilesSection}, paths_relative_to=moved)
    assert again.files.cache_dir == str(moved / "data" / "cache")  # the checkout moved: its data with it
    assert again.files.manifest == cfg.files.manifest and again.files.note == "x/y"


def test_paths_given_with_set_resolve_against_the_cwd(tmp_path, monkeypatch):
    source = tmp_path / "exp.yaml"
    source.write_text(yaml.safe_dump({"files": {"cache_dir": "in/file"}}))
    monkeypatch.chdir(tmp_path)
    overrides = ["files.cache_dir=mine/cache", "files.manifest=~/m.jsonl"]
    cfg = config_lib.load(source, {"files": FilesSection}, overrides, paths_relative_to="/repo")
    assert cfg.files.cache_dir == str(tmp_path / "mine" / "cache")
    assert cfg.files.manifest == os.path.join(os.path.expanduser("~"), "m.jsonl")
    nulled = config_lib.load(source, {"files": FilesSection}, ["files.manifest=null"], paths_relative_to="/repo")
    assert nulled.files.manifest is None and nulled.files.cache_dir == "/repo/in/file"


@pytest.mark.parametrize(
    "text, message",
    [
        ("train:\n  epochs: 3\n   batch_size: 4\n", r"bad\.yaml:3:\d+: YAML syntax error: mapping values are not allowed here"),
        ("train: [1, 2\n", r"bad\.yaml:2:1: YAML syntax error: while parsing a flow sequence expected ',' or ']'"),
        ("", r"bad\.yaml: a config is a YAML mapping with `task: NAME` and at least one section .* got an empty file"),
        ("# only a comment\n", "got an empty file"),
        ("task: toy\n", r"at least one section .*got \{'task': 'toy'\}"),
        ("- train\n- optim\n", r"got \['train', 'optim'\]"),
    ],
)
def test_a_file_that_is_not_a_config_is_one_line_naming_it(tmp_path, text, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(config_lib.ConfigError, match=message) as error:
        config_lib.load(bad, TASK)
    assert "\n" not in str(error.value) and str(bad) in str(error.value)


NAMES = MetricNames(best="wer", plotted=("cer", "wer"), shown=("cer",), percent=("cer", "wer", "ser"))


@pytest.mark.parametrize(
    "chosen, result",
    [(None, "wer"), ("cer", "cer"), ("ser", "ser")],  # null: the task's own; any metric MetricNames lists
)
def test_best_metric_is_one_the_task_reports(chosen, result):
    assert config_lib.best_metric(config_lib.CheckpointConfig(best_metric=chosen), NAMES) == result


@pytest.mark.parametrize("chosen, close", [("WER", "wer"), ("cre", "cer"), ("ser_rate", "ser")])
def test_a_best_metric_the_task_does_not_report_names_the_closest(chosen, close):
    checkpoint = config_lib.CheckpointConfig(best_metric=chosen)
    expected = f"checkpoint.best_metric '{chosen}' is not a metric of the task; did you mean '{close}'\\? " \
               "\\(its metrics: wer, cer, ser\\)"
    with pytest.raises(config_lib.ConfigError, match=f"^{expected}$"):
        config_lib.best_metric(checkpoint, MetricNames(best="wer", plotted=("cer", "wer"), shown=("ser",)))


@pytest.mark.parametrize(
    "optim, message",
    [
        ({"schedule": "anneal"}, "optim.schedule anneal needs optim.anneal_factor"),
        ({"schedule": "anneal", "anneal_factor": 0}, "optim.anneal_factor must be positive; got 0"),
        ({"clip_norm": -1}, "optim.clip_norm must be positive (or null for no clipping); got -1"),
    ],
)
def test_optimizer_settings_that_cannot_work_are_refused(optim, message):
    with pytest.raises(config_lib.ConfigError, match=re.escape(message)):
        config_lib.build({"optim": optim}, TASK)


def test_the_engine_optimizer_defaults_are_model_neutral():
    optim = config_lib.build({}, TASK).optim
    assert (optim.name, optim.schedule, optim.clip_norm, optim.momentum, optim.nesterov) == ("sgd", "constant", None, 0.0, False)
    assert optim.anneal_factor is None


# The settings each optimizer and schedule reads (jaxring/engine/optim.py).
USED_SETTINGS = {
    "sgd": {"learning_rate", "momentum", "nesterov"},
    "adamw": {"learning_rate", "weight_decay"},
    "anneal": {"anneal_factor"},
    "warmup_cosine": {"warmup_steps", "final_learning_rate"},
    "constant": set(),
}


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[3] / "configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_config_writes_out_its_optimizer_recipe(path):
    """A recipe written out in full cannot change when the engine's defaults do."""
    optim = yaml.safe_load(path.read_text())["optim"]
    assert set(USED_SETTINGS) >= {optim["name"], optim["schedule"]}
    needed = {"name", "schedule", "clip_norm"} | USED_SETTINGS[optim["name"]] | USED_SETTINGS[optim["schedule"]]
    assert needed <= set(optim), f"{path.name} leaves {sorted(needed - set(optim))} to the engine's defaults"


def test_sections_are_immutable_and_saved_in_schema_order(tmp_path):
    cfg = config_lib.build({"task": "toy", "optim": {"learning_rate": 0.5}}, TASK)
    for section in (cfg.train, cfg.optim, cfg.eval, cfg.checkpoint):
        with pytest.raises(dataclasses.FrozenInstanceError):
            section.seed = 1  # one resolved config, as saved in the run directory
    config_lib.save(cfg, tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert list(saved) == ["task", *TASK, *config_lib.ENGINE_SECTIONS]  # not sorted: the task's name first
    assert list(saved["optim"])[:2] == ["name", "learning_rate"]


def test_an_override_of_a_section_that_is_not_a_mapping_is_an_error():
    with pytest.raises(config_lib.ConfigError, match=r"^optim must be a mapping of keys to values; got \[1, 2\]$"):
        config_lib.apply_overrides({"optim": [1, 2]}, ["optim.learning_rate=0.1"], config_lib.ENGINE_SECTIONS)


def test_set_task_names_the_task_whose_sections_the_file_is_checked_against(tmp_path):
    source = tmp_path / "exp.yaml"
    source.write_text(yaml.safe_dump({"task": "toy", "train": {"epochs": 3}}))
    assert config_lib.task_name(source, ["optim.name=adamw", "task=other", "task=mine"]) == "mine"
    assert config_lib.task_name(source, ["optim.name=adamw"]) == "toy"
    cfg = config_lib.load(source, TASK, ["task=mine", "train.epochs=4"])
    assert cfg.task == "mine" and cfg.train.epochs == 4
    with pytest.raises(config_lib.ConfigError, match=r"section\.key=value .* or task=NAME; got 'task'"):
        config_lib.build({}, TASK, ["task"])
