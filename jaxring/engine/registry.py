"""The task registry: the class an experiment's `task:` key names, checked against the contract.

A `task:` value is looked up in this order:

1. a name registered in this process with `register(name, "module:Class")`
   (the checkout's models/__init__.py registers `deepspeech2` this way);
2. a name that an installed distribution declares in the entry-point group
   `jaxring.tasks` (in its pyproject.toml:
   `[project.entry-points."jaxring.tasks"]` then `mlp = "mypkg.task:MLPTask"`);
3. an import path `package.module:Class`, importable from the Python path.

Targets are imported when looked up, so a task's dependencies load only when it
is used. The class is checked (`check_task_class`) before it is used: every
member the engine calls must be there with the arguments it passes.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
from typing import Any, Mapping

from jaxring.engine.config import ENGINE_SECTIONS, TASK_KEY, Config, ConfigError
from jaxring.engine.task import MetricNames, Task

ENTRY_POINT_GROUP = "jaxring.tasks"
_HOW_TO_REGISTER = (
    f"name a class by its import path (task: package.module:Class, its folder on PYTHONPATH), declare it in the "
    f"entry-point group {ENTRY_POINT_GROUP!r} of an installed package, or call "
    f"jaxring.engine.registry.register(name, 'package.module:Class') before the config is loaded"
)

_registered: dict[str, str] = {}

# The members the engine calls, with the arguments it passes (besides self).
REQUIRED_METHODS = {
    "init": ("rng",),
    "loss": ("variables", "batch", "rng"),
    "predict": ("variables", "batch"),
    "score": ("outputs", "batch"),
    "summarize": ("counts",),
    "train_batches": ("batch_size", "shard", "seed"),
    "eval_batches": ("split", "batch_size", "shard", "limit"),
}
OPTIONAL_METHODS = {
    "from_config": ("config",),
    "check_data": (),
    "final_report": ("config", "workdir", "summary"),
    "add_evaluate_arguments": ("parser",),  # scripts/evaluate.py's, called on the class
    "evaluate": ("args", "config", "variables"),
    "optimizer": ("schedule",),  # the task's own optax optimizer (jaxring/engine/own_optimizer.py)
}


def register(name: str, target: str) -> None:
    """Makes `task: name` mean the class at import path `target` ("package.module:Class")."""
    if not isinstance(target, str) or target.count(":") != 1 or not all(target.split(":")):
        raise ValueError(f"register({name!r}, {target!r}): the target must be an import path 'package.module:Class'")
    _registered[name] = target


def registered() -> dict[str, str]:
    """Every name this process can resolve without an import path: registered ones, then entry points."""
    declared = {entry.name: entry.value for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    return {**declared, **_registered}


def task_class(name: str) -> type:
    """The task class `name` resolves to (module docstring), checked against the contract."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{TASK_KEY} must name a task; got {name!r}")
    known = registered()
    if name in known:
        cls = import_target(known[name], f"task {name!r} (registered as {known[name]!r})")
    elif ":" in name:
        cls = import_target(name, f"task {name!r}")
    else:
        listed = ", ".join(f"{key} ({value})" for key, value in sorted(known.items())) or "none"
        raise ConfigError(f"unknown task {name!r}: it is not registered (registered tasks: {listed}) and is no "
                          f"import path 'package.module:Class'; to use your own task, {_HOW_TO_REGISTER}")
    check_task_class(cls)
    return cls


def import_target(target: str, what: str) -> Any:
    """The object at import path `target` ("package.module:name"), or a ConfigError saying, for `what`, why not."""
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ConfigError(f"{what}: cannot import module {module_name!r} ({e}); its package must be installed or "
                          "its folder on the Python path (PYTHONPATH)") from None
    if not hasattr(module, attribute):
        classes = sorted(key for key, value in vars(module).items()
                         if inspect.isclass(value) and value.__module__ == module.__name__)
        raise ConfigError(f"{what}: module {module_name!r} ({module.__file__}) has no {attribute!r}"
                          f"{'; its classes: ' + ', '.join(classes) if classes else ''}")
    return getattr(module, attribute)


def check_task_class(cls) -> None:
    """Raises ConfigError naming every member of `cls` the engine would call but cannot (jaxring/engine/task.py)."""
    name = getattr(cls, "__qualname__", repr(cls))
    if not inspect.isclass(cls):
        raise ConfigError(f"a task must be a class; {name} is a {type(cls).__name__}")
    problems = [problem for method, arguments in REQUIRED_METHODS.items()
                if (problem := _method_problem(cls, method, arguments, required=True))]
    problems += [problem for method, arguments in OPTIONAL_METHODS.items()
                 if (problem := _method_problem(cls, method, arguments, required=False))]
    problems += _sections_problems(cls)
    metrics = inspect.getattr_static(cls, "metrics", None)
    if metrics is not None and not isinstance(metrics, MetricNames):
        problems.append(f"metrics must be a jaxring.engine.task.MetricNames; got {type(metrics).__name__}")
    if problems:
        raise ConfigError(f"task class {cls.__module__}.{name} does not meet the Task contract "
                          f"(jaxring/engine/task.py): " + "; ".join(problems))


def _method_problem(cls, method: str, arguments: tuple[str, ...], required: bool) -> str | None:
    wanted = f"{method}({', '.join(('self',) + arguments)})"
    inherited_stub = inspect.getattr_static(cls, method, None) is inspect.getattr_static(Task, method, object())
    if not hasattr(cls, method) or (required and inherited_stub):  # a subclass of Task inherits empty stubs
        return f"missing method {wanted}" if required else None
    member = getattr(cls, method)
    if not callable(member):
        return f"{method} must be a method {wanted}; got {type(member).__name__}"
    try:
        signature = inspect.signature(member)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return None
    bound_to_class = isinstance(inspect.getattr_static(cls, method), (classmethod, staticmethod))
    placeholders = arguments if bound_to_class else ("self",) + arguments
    try:
        signature.bind(*placeholders)
    except TypeError:
        return f"{method}{signature} cannot be called as {wanted}"
    return None


def _sections_problems(cls) -> list[str]:
    sections = getattr(cls, "config_sections", {})
    if not isinstance(sections, Mapping):
        return [f"config_sections must map section names to dataclasses; got {type(sections).__name__}"]
    problems = []
    for key, section in sections.items():
        if key in ENGINE_SECTIONS or key == TASK_KEY:
            problems.append(f"config_sections names {key!r}, which the engine owns "
                            f"(its sections: {', '.join(ENGINE_SECTIONS)})")
        elif not (inspect.isclass(section) and dataclasses.is_dataclass(section)):
            problems.append(f"config_sections[{key!r}] must be a dataclass; got {section!r}")
    return problems


def config_sections(cls) -> dict[str, type]:
    """The task's config sections by name; none when the class declares none."""
    return dict(getattr(cls, "config_sections", Task.config_sections))


def build_task(cls, config: Config):
    """The task `config` describes: the class's from_config, else the class called with its sections by name."""
    default = Task.from_config.__func__  # the contract's default: the class called with its sections
    task = cls.from_config(config) if hasattr(cls, "from_config") else default(cls, config)
    if not isinstance(getattr(task, "metrics", None), MetricNames):
        raise ConfigError(f"task {cls.__module__}.{cls.__qualname__} has no metrics: give it a class attribute "
                          "`metrics = MetricNames(best=..., plotted=..., shown=...)` (jaxring/engine/task.py) "
                          "naming the keys its summarize returns")
    return task


def checked_loss(task, result) -> tuple[Any, Any]:
    """`result` of task.loss, if it is the contract's (loss, aux); else a TypeError saying what came back."""
    if isinstance(result, tuple) and len(result) == 2 and getattr(result[0], "shape", None) == ():
        return result
    got = (f"a {len(result)}-tuple" if isinstance(result, tuple)
           else f"one array of shape {result.shape}" if hasattr(result, "shape")
           else type(result).__name__)
    if isinstance(result, tuple) and len(result) == 2:
        got = f"a pair whose loss has shape {getattr(result[0], 'shape', type(result[0]).__name__)}"
    raise TypeError(f"{type(task).__qualname__}.loss must return (loss, aux): the mean loss of the device batch as a "
                    f"scalar, and a dict of updated non-param collections ({{}} when there are none); got {got}")
