"""A finished run's last line: the task's final scores, then what trained it and how long it took.

The task may score more at the end (its optional `final_report` hook,
jaxring/engine/task.py); without the hook the line shows the metrics its
MetricNames declares. The engine's part is the same for every task.
"""

from __future__ import annotations

from pathlib import Path

from jaxring.engine.progress import counted
from jaxring.engine.task import MetricNames

# What ends every finished run's last line before its directory: scripts/run_checked.py
# looks for it in a launch's output.
FINISHED_MARKER = "; run directory "


def metrics_result(metrics: MetricNames, summary: dict) -> str:
    """The engine's default result text: the task's plotted, best and shown metrics on test (if scored)
    and dev, each as the task declares it (a rate as a percentage)."""
    names = dict.fromkeys((*metrics.plotted, metrics.best, *metrics.shown))
    parts = []
    for split in ("test", "dev"):
        shown = [f"{name} {metrics.format(name, summary[f'{split}_{name}'])}" for name in names
                 if f"{split}_{name}" in summary]
        if shown:
            parts.append(f"{split} {', '.join(shown)}")
    return "; ".join(parts) + f" (checkpoint of step {summary['best_step']})"


def trained_by(summary: dict, platform: str) -> str:
    """How many devices and processes trained the run, what carried its average, and that's share of its steps."""
    devices, processes = summary["local_devices"], summary["processes"]
    line = (f"trained on {counted(devices, f'{platform} device')} x {counted(processes, 'process')}, "
            f"{carried_by(summary)}")
    share = summary.get("last_window_allreduce_share_estimate")
    if devices * processes == 1:
        return line + " over one replica (no exchange)"
    # A tenth of a percent: a ring's share on CPU is often under 1%, which a whole percent shows as 0.
    return line + (f" {100 * share:.1f}% of the step" if share is not None else "")


def carried_by(summary: dict) -> str:
    """What carried the gradient average: train.allreduce's all-reduce, or with train.across_processes mpi4jax
    over several processes, mpi4jax across them after that all-reduce over each process' devices (if several)."""
    if summary.get("across_processes") != "mpi4jax":  # absent: a summary from before the setting
        return f"{summary['allreduce']} all-reduce"
    across = "mpi4jax all-reduce across processes"
    return f"{summary['allreduce']} all-reduce over each process' devices, then {across}" \
        if summary["local_devices"] > 1 else across


def took(summary: dict) -> str:
    seconds = summary["train_seconds"]  # None: resumed from a checkpoint that did not record the earlier time
    return f"{seconds:.0f} s" if seconds is not None else f"{summary['train_seconds_since_resume']:.0f} s since the resume"


def final_report(task, config, workdir: str | Path, summary: dict, platform: str) -> tuple[dict, str]:
    """(the summary with the task's final scores added, the run's last line), on the lead process.

    `platform`: the kind of device that trained ("cpu", "gpu").
    """
    hook = getattr(task, "final_report", None)
    scores, result = hook(config, workdir, summary) if hook is not None else ({}, "")
    result = result or metrics_result(task.metrics, summary)  # the contract's default (jaxring/engine/task.py)
    summary = {**summary, **scores}
    return summary, f"{result}; {trained_by(summary, platform)}; {took(summary)}{FINISHED_MARKER}{workdir}"
