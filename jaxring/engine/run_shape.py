"""The shape a run trains on (processes x local devices, global batch), and a resume on another one.

Each checkpoint records its shape (SHAPE_KEY); a resume compares it with its
own (`resume_note`) and one without --host-devices splits the CPU as it was
split (launch.resumed_host_devices). docs/MULTI_NODE.md, "Resuming on another shape".
"""

from __future__ import annotations

from pathlib import Path

from jaxring.engine.progress import counted
from jaxring.engine.rundir import RunDirectoryError

# The key of a checkpoint's extra dict that records the shape it trained on (`shape`).
SHAPE_KEY = "shape"


def shape(processes: int, local_devices: int, platform: str, global_batch: int) -> dict:
    return {"processes": processes, "local_devices": local_devices, "platform": platform, "global_batch": global_batch}


def trained_shape(workdir: Path) -> dict | None:
    """The shape the newest intact checkpoint in `workdir` trained on; None where there is none (the
    resume itself reports that). Reads the checkpoint: call it on one process."""
    from jaxring.engine.checkpoint import LATEST, CheckpointError, Checkpoints  # imports flax: only when resuming

    try:
        return Checkpoints(workdir / "checkpoints").read(LATEST).extra.get(SHAPE_KEY)
    except (FileNotFoundError, CheckpointError):
        return None


def resume_note(trained: dict, now: dict, step: int, batches) -> str | None:
    """One line where the checkpoint of `step` trained on another shape than `now`, saying what carries on;
    refuses a new process count that `batches`, the task's training Batches, cannot follow.

    The engine keeps the step, the schedule and the global batch; the data order is the Batches'. One that
    sets `global_order` (jaxring/engine/task.py, Batches) yields slices of a sequence of global batches that
    depends on the seed and the global batch alone, and its state() is a position in that sequence, so
    rank 0's position means the same on any number of processes; a new local device count alone changes
    nothing the loader sees. Each replica's random draws (dropout, augmentation) are not kept: they are
    folded from the replica's index (jaxring/engine/step.py, StepParts.local)."""
    if all(trained[key] == now[key] for key in ("processes", "local_devices", "global_batch")):
        return None
    was, new = (f"{s['processes']} x {s['local_devices']} {s['platform']}" for s in (trained, now))
    batch = now["global_batch"]
    if trained["global_batch"] != batch:
        return (f"resuming step {step} on {new} (processes x local devices; trained on {was}) with global batch {batch} "
                f"where it trained with {trained['global_batch']} (train.batch_size): the steps and the learning-rate "
                "schedule carry on, the data order does not")
    loader = type(batches)
    if trained["processes"] != now["processes"] and not getattr(batches, "global_order", False):
        raise RunDirectoryError(
            f"the checkpoint of step {step} trained on {counted(trained['processes'], 'process')} and this run has "
            f"{now['processes']}; the task's training batches ({loader.__module__}.{loader.__qualname__}) do not "
            f"set global_order, so their order would change with the process count: resume on "
            f"{counted(trained['processes'], 'process')} (mpirun -np {trained['processes']}), local devices as you like "
            "(docs/MULTI_NODE.md, \"Resuming on another shape\")")
    return (f"resuming step {step} on {new} (processes x local devices; trained on {was}): the same global batch "
            f"{batch} ({batch // (now['processes'] * now['local_devices'])} per device), data order and "
            "learning-rate schedule; each replica's random draws are new")
