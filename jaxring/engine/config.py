"""Experiment configs: YAML files checked against typed dataclass sections.

An experiment file names its task (`task: NAME`, resolved by the task
registry, jaxring/engine/registry.py) and has one YAML mapping per section.
The engine owns the `train`, `optim`, `eval` and `checkpoint` sections
(dataclasses below); the task brings its own sections as dataclasses. Every
key is checked: a misspelled one is an error that names the closest valid key,
and `--set section.key=value` overrides are converted to the type the schema
declares, so `--set optim.learning_rate=1e-3` is a float, not YAML's string.

Fields declared `ConfigPath` name files or folders. A relative one written in
a config file resolves against the folder the loader names (`load(...,
paths_relative_to=)`; which folder a launcher names: jaxring/engine/experiment.py),
one given with `--set` against the current directory, as any path typed on a
command line; the resolved config holds absolute paths. The copy saved in a
run directory writes those inside the folder they were resolved against
relative to it again (save()), so a run keeps finding the checkout's data
after the checkout moves.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Mapping

import yaml

from jaxring.engine.optim import DECAY_MASKS, OPTIMIZERS, SCHEDULES


class ConfigError(ValueError):
    """A config file or override that does not fit the schema."""


class OverrideError(ConfigError):
    """A `--set` override that does not fit the schema: the command line is wrong, not the file."""


_PATH_MARK = "config path"
ConfigPath = Annotated[str, _PATH_MARK]  # a file or folder; relative ones are resolved (module docstring)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    seed: int = 0  # initial weights, data order and dropout; every process derives its own streams from it
    batch_size: int = 32  # global: split across processes, then local devices
    epochs: int = 20  # passes over the training data (unless max_steps is set)
    max_steps: int | None = None  # the run's length in steps, in place of epochs (the data repeats as needed)
    allreduce: str = "ring"  # "ring" (jaxring) | "psum" (jax.lax.pmean)
    bucket_bytes: int | None = None  # tensor-fusion bucket size; null: the devices' platform default (collectives/fusion.py)
    log_every: int = 10  # steps between metrics.jsonl rows
    off_size_batches: str = "warn"  # a batch of other than batch_size / processes rows: "warn" (once) | "refuse"
    compute_dtype: str = "float32"  # the loss's dtype: "float32" | "bfloat16" | "float16" (loss-scaled); weights and updates stay float32 (engine/precision.py)
    accumulate_steps: int = 1  # micro-batches per update: each device's batch is split into this many, whose gradients are summed before the one all-reduce
    allreduce_dtype: str | None = None  # what gradients cross processes in: null (their accumulation type, rounded once) | "bfloat16" | "float16" (half float32's bytes; each hop adds in float32); no effect within one process
    across_processes: str = "jaxring"  # what carries the gradient mean across processes: "jaxring" (its MPI ring, in the step's one program) | "mpi4jax" (mpi4jax.allreduce; with several local devices, between the pmapped gradients and update); docs/MULTI_NODE.md
    shard_optimizer: bool = False  # ZeRO-1/2: gradients reduce-scattered, each device of every process updates its block of the weights with its block of the optimizer state (1/N of it, N devices in all), the weights all-gathered; sgd and adamw only (collectives/sharded_update.py)

    def __post_init__(self):
        _check_choice("train.allreduce", self.allreduce, ("ring", "psum"))
        _check_choice("train.across_processes", self.across_processes, ("jaxring", "mpi4jax"))
        if self.shard_optimizer and self.across_processes == "mpi4jax":
            raise ConfigError("train.shard_optimizer: true needs train.across_processes: jaxring (its reduce-scatter "
                              "and all-gather cross processes by jaxring's MPI leg; mpi4jax's path carries an "
                              "all-reduce only): set one of the two back to its default")
        _check_choice("train.off_size_batches", self.off_size_batches, ("warn", "refuse"))
        _check_choice("train.compute_dtype", self.compute_dtype, ("float32", "bfloat16", "float16"))
        if self.allreduce_dtype is not None:
            _check_choice("train.allreduce_dtype", self.allreduce_dtype, ("bfloat16", "float16", "float32"))
        _check_positive("train.batch_size", self.batch_size)
        _check_positive("train.log_every", self.log_every)
        _check_positive("train.accumulate_steps", self.accumulate_steps, "1 for none")
        if self.bucket_bytes is not None:
            _check_positive("train.bucket_bytes", self.bucket_bytes, "or null for the platform's default")
        _check_positive("train.epochs", self.epochs, "leave at least one step")
        if self.max_steps is not None:
            _check_positive("train.max_steps", self.max_steps, "leave at least one step, or null for no limit")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    # Model-neutral defaults: plain SGD at a constant rate, no clipping. A task's
    # recipe is written out in its configs (configs/*.yaml, examples/*/*.yaml).
    name: str = "sgd"  # "sgd" | "adamw" | "package.module:function": your own optax optimizer from the schedule (engine/own_optimizer.py)
    learning_rate: float = 3e-4  # the peak rate: schedules start from it (warmup_cosine reaches it after warmup_steps)
    momentum: float = 0.0  # sgd; 0: plain SGD
    nesterov: bool = False  # sgd
    weight_decay: float = 0.0  # adamw
    weight_decay_mask: str = "all"  # adamw: the weights that decay: "all" | "matrices" (leaves of two or more dimensions: no biases, no norms' scales)
    schedule: str = "constant"  # "constant" | "anneal" | "warmup_cosine"
    anneal_factor: float | None = None  # anneal (required): learning rate divided by this after each epoch
    warmup_steps: int = 0  # warmup_cosine
    final_learning_rate: float = 0.0  # warmup_cosine
    clip_norm: float | None = None  # global gradient-norm clipping; null: none

    def __post_init__(self):
        if ":" not in self.name:  # an import path is checked when the trainer imports it
            _check_choice("optim.name", self.name, tuple(OPTIMIZERS))
        _check_choice("optim.schedule", self.schedule, tuple(SCHEDULES))
        _check_choice("optim.weight_decay_mask", self.weight_decay_mask, tuple(DECAY_MASKS))
        _check_positive("optim.learning_rate", self.learning_rate)
        if self.schedule == "anneal" and self.anneal_factor is None:
            raise ConfigError("optim.schedule anneal needs optim.anneal_factor, the learning rate's divisor after "
                              "each epoch (e.g. 1.2)")
        if self.anneal_factor is not None:
            _check_positive("optim.anneal_factor", self.anneal_factor)
        if self.clip_norm is not None:
            _check_positive("optim.clip_norm", self.clip_norm, "or null for no clipping")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    every_steps: int = 0  # dev metrics every this many steps (0: only at the end)
    batch_size: int = 32  # examples per evaluation batch of each process, split over its local devices
    max_examples: int | None = None  # score the first N dev examples only (test is always whole)
    test_at_end: bool = True  # also score the test split when training ends

    def __post_init__(self):
        _check_not_negative("eval.every_steps", self.every_steps)
        _check_positive("eval.batch_size", self.batch_size)
        if self.max_examples is not None:
            _check_positive("eval.max_examples", self.max_examples, "or null to score the whole dev split")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every_steps: int = 0  # 0: only at the end (and at each dev evaluation)
    keep: int = 3  # most recent checkpoints kept, besides the best one
    best_metric: str | None = None  # dev metric that picks the best checkpoint (lower is better); null: the task's

    def __post_init__(self):
        _check_not_negative("checkpoint.every_steps", self.every_steps)
        _check_positive("checkpoint.keep", self.keep)


def best_metric(checkpoint: CheckpointConfig, metrics) -> str:
    """checkpoint.best_metric, else the task's; a name the task's MetricNames (jaxring/engine/task.py) lists.

    Checked before the first step: a misspelled metric would otherwise never be
    found in the dev results, no checkpoint would be the best, and test would be
    scored on the final weights.
    """
    name = checkpoint.best_metric or metrics.best
    if name not in metrics.names:
        close = closest_key(name, metrics.names)
        raise ConfigError(
            f"checkpoint.best_metric {name!r} is not a metric of the task"
            f"{f'; did you mean {close!r}?' if close else ''} (its metrics: {', '.join(metrics.names)})"
        )
    return name


TASK_KEY = "task"  # the top-level key that names the task

ENGINE_SECTIONS: dict[str, type] = {
    "train": TrainConfig,
    "optim": OptimConfig,
    "eval": EvalConfig,
    "checkpoint": CheckpointConfig,
}


def _check_choice(name, value, choices):
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _check_positive(name, value, hint=""):
    if not value > 0:  # also refuses NaN
        raise ConfigError(f"{name} must be positive{f' ({hint})' if hint else ''}; got {value!r}")


def _check_not_negative(name, value):
    if value < 0:
        raise ConfigError(f"{name} must be 0 (off) or a positive number of steps; got {value!r}")


def closest_key(key: str, valid) -> str | None:
    """The valid key a user most likely meant: abbreviation ("lr"), prefix, else spelling."""
    valid = list(valid)
    key = str(key).lower()
    for candidate in valid:
        if key == "".join(part[0] for part in candidate.split("_") if part):
            return candidate
    for candidate in valid:
        if candidate.startswith(key) or key.startswith(candidate):
            return candidate
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.0)
    return close[0] if close else None


def _unknown_key_error(where: str, key: str, valid) -> ConfigError:
    close = closest_key(key, valid)
    hint = f"; did you mean {close!r}?" if close else ""
    return ConfigError(f"unknown key {key!r} in {where}{hint} (valid keys: {', '.join(valid)})")


def _field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def _is_path(annotation: Any) -> bool:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_is_path(option) for option in typing.get_args(annotation))
    return typing.get_origin(annotation) is Annotated and _PATH_MARK in annotation.__metadata__


def _path_fields(cls) -> list[str]:
    """The fields of section `cls` declared as ConfigPath (or ConfigPath | None)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return [f.name for f in dataclasses.fields(cls) if f.init and _is_path(hints[f.name])]


def _absolute(path: str | None, base: str | Path) -> str | None:
    return None if path is None else os.path.normpath(os.path.join(base, os.path.expanduser(path)))


def _coerce(where: str, value: Any, annotation: Any) -> Any:
    """`value` as an instance of `annotation` (int -> float allowed, nothing lossy)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(where, value, option)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0])
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list; got {value!r}")
        args = typing.get_args(annotation)
        item = args[0] if args else Any
        return origin(_coerce(f"{where}[{i}]", v, item) for i, v in enumerate(value))
    if annotation is Any:
        return value
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is int and isinstance(value, bool):
        raise ConfigError(f"{where} must be an int; got {value!r}")
    if dataclasses.is_dataclass(annotation):
        return section_from_dict(annotation, value, where)
    if not isinstance(value, annotation):
        raise ConfigError(
            f"{where} must be {getattr(annotation, '__name__', annotation)}; "
            f"got {type(value).__name__} {value!r}"
        )
    return value


def section_from_dict(cls, values: Mapping[str, Any] | None, where: str):
    """Builds dataclass section `cls` from a mapping, checking every key and type."""
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where} must be a mapping of keys to values; got {values!r}")
    fields = _field_types(cls)
    for key in values:
        if key not in fields:
            raise _unknown_key_error(where, key, fields)
    try:  # the section's own checks (__post_init__) name the key they reject
        return cls(**{key: _coerce(f"{where}.{key}", values[key], fields[key]) for key in values})
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from None


def parse_override_value(text: str, annotation: Any) -> Any:
    """The value of `--set key=text` for a field declared as `annotation`."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        if text.lower() in ("null", "none", "~") and type(None) in typing.get_args(annotation):
            return None
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        return parse_override_value(text, options[0])
    if annotation is bool:
        lowered = text.lower()
        if lowered in ("true", "yes", "on", "1"):
            return True
        if lowered in ("false", "no", "off", "0"):
            return False
        raise ConfigError(f"expected true or false; got {text!r}")
    if annotation in (int, float):
        try:
            return annotation(text)
        except ValueError:
            raise ConfigError(f"expected {annotation.__name__}; got {text!r}") from None
    if annotation is str:
        return text
    return yaml.safe_load(text)


def apply_overrides(raw: dict, overrides: list[str], sections: Mapping[str, type]) -> dict:
    """`raw` (section -> mapping) with each `section.key=value` of `overrides` applied."""
    raw = dict(raw)
    for item in overrides:
        path, sep, text = item.partition("=")
        if path == TASK_KEY and sep:
            continue  # the task picks the sections: build() reads it first (task_override)
        if not sep or "." not in path:
            raise OverrideError(f"--set takes section.key=value (e.g. optim.learning_rate=1e-3) or "
                                f"{TASK_KEY}=NAME; got {item!r}")
        section, _, key = path.partition(".")
        if section not in sections:
            raise OverrideError(f"--set {item}: {_unknown_key_error('the config', section, sections)}")
        cls = sections[section]
        fields = _field_types(cls)
        if key not in fields:
            raise OverrideError(f"--set {item}: {_unknown_key_error(section, key, fields)}")
        try:
            value = parse_override_value(text, fields[key])
        except ConfigError as e:
            raise OverrideError(f"--set {path}: {e}") from None
        if key in _path_fields(cls):
            value = _absolute(value, os.getcwd())
        current = raw.get(section) or {}
        if not isinstance(current, Mapping):
            raise ConfigError(f"{section} must be a mapping of keys to values; got {current!r}")
        raw[section] = {**current, key: value}
    return raw


@dataclasses.dataclass(frozen=True)
class Config:
    """A resolved experiment: the task's name and one typed object per section, by section name."""

    sections: Mapping[str, Any]
    task: str | None = None
    paths_relative_to: str | None = None  # the folder relative paths were resolved against, if any

    def __getattr__(self, name):
        if name == "sections":  # not yet set (copy, unpickling): no recursion
            raise AttributeError(name)
        try:
            return self.sections[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_dict(self) -> dict:
        named = {TASK_KEY: self.task} if self.task is not None else {}
        return {**named, **{name: to_dict(value) for name, value in self.sections.items()}}


def to_dict(section) -> Any:
    if dataclasses.is_dataclass(section):
        return {f.name: to_dict(getattr(section, f.name)) for f in dataclasses.fields(section)}
    if isinstance(section, tuple):
        return list(section)
    return section


def build(raw: Mapping[str, Any], task_sections: Mapping[str, type], overrides=()) -> Config:
    """A Config from a parsed YAML mapping: the task's name, engine sections plus the task's."""
    sections = {**task_sections, **ENGINE_SECTIONS}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"a config is a mapping of sections ({', '.join(sections)}); got {raw!r}")
    task = task_override(overrides) or raw.get(TASK_KEY)
    if task is not None and not isinstance(task, str):
        raise ConfigError(f"{TASK_KEY} must be the name of a registered task; got {task!r}")
    for name in raw:
        if name not in sections and name != TASK_KEY:
            raise _unknown_key_error("the config", name, [TASK_KEY, *sections])
    raw = apply_overrides(dict(raw), list(overrides), sections)
    return Config({name: section_from_dict(cls, raw.get(name), name) for name, cls in sections.items()}, task)


def resolve_paths(config: Config, base: str | Path) -> Config:
    """`config` with each relative ConfigPath joined to `base`; absolute paths and nulls are kept."""
    sections = {}
    for name, section in config.sections.items():
        paths = _path_fields(type(section)) if dataclasses.is_dataclass(section) else []
        sections[name] = dataclasses.replace(section, **{key: _absolute(getattr(section, key), base) for key in paths})
    return dataclasses.replace(config, sections=sections, paths_relative_to=str(base))


def _read(path: str | Path) -> Any:
    """The parsed YAML mapping at `path`: a file that is missing, not YAML, empty or not a mapping is an error."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = " ".join(filter(None, (e.context, e.problem)))
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a YAML file ({type(e).__name__}: {e})") from None
    if not isinstance(raw, Mapping):
        raise _not_a_config(path, "an empty file" if raw is None else repr(raw)[:80])
    return raw


def _not_a_config(path, got: str) -> ConfigError:
    return ConfigError(
        f"{path}: a config is a YAML mapping with `{TASK_KEY}: NAME` and at least one section "
        f"({', '.join(ENGINE_SECTIONS)}, and the task's); got {got}"
    )


def task_override(overrides) -> str | None:
    """The task a `--set task=NAME` names (the last one wins), or None."""
    named = [item.partition("=")[2] for item in overrides if item.partition("=")[:2] == (TASK_KEY, "=")]
    return named[-1] if named else None


def task_name(path: str | Path, overrides=()) -> str:
    """The `task:` an experiment file names, or `--set task=NAME` overrides: it picks the sections it may have."""
    if task_override(overrides):
        return task_override(overrides)
    raw = _read(path)
    name = raw.get(TASK_KEY) if isinstance(raw, Mapping) else None
    if not isinstance(name, str):
        raise ConfigError(f"{path}: the config needs a top-level `{TASK_KEY}: NAME` naming the model's task")
    return name


def load(path: str | Path, task_sections: Mapping[str, type], overrides=(), paths_relative_to=None) -> Config:
    """Reads and validates the YAML experiment at `path`.

    Relative ConfigPath values of the file (and defaults) are joined to
    `paths_relative_to`; None leaves them relative to the current directory.
    """
    raw = _read(path)
    if not set(raw) - {TASK_KEY}:
        raise _not_a_config(path, repr(dict(raw))[:80])
    try:
        config = build(raw, task_sections, overrides)
    except OverrideError:
        raise
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return config if paths_relative_to is None else resolve_paths(config, paths_relative_to)


def save(config: Config, path: str | Path) -> None:
    """Writes `config` as YAML that load() reads back. Paths inside the folder the config's
    relative paths were resolved against (the checkout, for the scripts) are written relative
    to it again, so a run directory still finds its data after the checkout moves; others stay
    absolute."""
    values = config.to_dict()
    base = config.paths_relative_to
    if base is not None:
        for name, section in config.sections.items():
            for key in _path_fields(type(section)) if dataclasses.is_dataclass(section) else []:
                value = values[name][key]
                if value is not None and Path(value).is_relative_to(base):
                    values[name][key] = os.path.relpath(value, base)
    with open(path, "w") as f:
        yaml.safe_dump(values, f, sort_keys=False)
