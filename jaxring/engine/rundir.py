"""Taking over a run directory: a run is never deleted implicitly.

The command line picks one of three ways in:

- neither --resume nor --overwrite: the directory must hold no run (no
  checkpoint, nothing set aside by --overwrite); else an error says which flag
  to give;
- --resume: continue from the newest intact checkpoint; a directory without
  one starts fresh, after a one-line notice; a finished run (its summary
  written at the step the config ends on) is an error saying how to extend it;
- --overwrite: start over. The previous run's files move to WORKDIR/replaced/
  and are deleted only once the new run has written its first checkpoint, so
  a run stopped before that still has the old one, there.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

# What scripts/train.py writes into a run directory (checkpoints/ is Trainer's CHECKPOINTS).
RUN_FILES = (
    "checkpoints", "metrics.jsonl", "summary.json", "config.yaml", "tensorboard", "plots", "data_report.json"
)
REPLACED = "replaced"

class RunDirectoryError(RuntimeError):
    """The run directory holds a run and the command line did not say what to do with it."""


def take_over(workdir: Path, checkpoint_steps: list[int], resume: bool, overwrite: bool, lead: bool) -> bool:
    """Prepares `workdir` for a run; returns whether the run resumes from a checkpoint.

    `checkpoint_steps`: the steps of the checkpoints the directory holds. Only
    the `lead` process moves files; every process gets the same answer.
    """
    if resume and overwrite:
        raise RunDirectoryError("give --resume or --overwrite, not both")
    replaced = workdir / REPLACED
    if resume:
        if checkpoint_steps:
            return True
        if lead:
            print(f"--resume: no checkpoint in {workdir}, starting a fresh run there", flush=True)
        return False
    if overwrite:
        if lead:
            _set_aside(workdir, has_checkpoints=bool(checkpoint_steps))
        return False
    if checkpoint_steps or replaced.exists():
        held = f"checkpoints up to step {checkpoint_steps[-1]}" if checkpoint_steps else f"a replaced run in {replaced}"
        raise RunDirectoryError(
            f"{workdir} holds {held}: give --resume to continue it, or --overwrite to start over "
            "(the old files are deleted once the new run has written its first checkpoint), "
            "or choose another --workdir"
        )
    return False


class RunFinished(RunDirectoryError):
    """--resume of a run that has nothing left to do."""


def refuse_finished(workdir: Path, resumed_step: int, total_steps: int) -> None:
    """Raises RunFinished if the checkpoint resumed, of `resumed_step`, is where the run in
    `workdir` ended (its summary.json says so) and that is at or past `total_steps`: resuming
    would only repeat the end. A run stopped during its final evaluation has no summary of
    that step yet, and resumes."""
    summary = workdir / "summary.json"
    if resumed_step < total_steps or not summary.is_file():
        return
    try:
        ended_at = json.loads(summary.read_text()).get("steps")
    except (OSError, ValueError):
        return
    if ended_at != resumed_step:
        return
    raise RunFinished(
        f"the run in {workdir} is finished: it trained {resumed_step} steps (train.max_steps, else train.epochs "
        f"x steps per epoch, gives {total_steps}) and its results are in {summary}. To train it longer, give a "
        f"larger length: --resume --set train.max_steps={2 * resumed_step} (or train.epochs); to score it again: "
        "scripts/evaluate.py --workdir " + str(workdir)
    )


def _set_aside(workdir: Path, has_checkpoints: bool) -> None:
    replaced = workdir / REPLACED
    if replaced.exists() and has_checkpoints:
        # An --overwrite run wrote its checkpoint, then stopped before removing what it replaced.
        discard_replaced(workdir)
    present = [workdir / name for name in RUN_FILES if (workdir / name).exists()]
    if replaced.exists():
        # An earlier --overwrite was stopped before its first checkpoint: what it left holds
        # no checkpoint, while replaced/ still holds the run it replaces.
        for path in present:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        print(f"--overwrite: the run set aside earlier stays in {replaced} until the first new checkpoint", flush=True)
        return
    if not present:
        return
    replaced.mkdir()
    for path in present:
        path.rename(replaced / path.name)
    print(f"--overwrite: the previous run moved to {replaced}; it is deleted once the first new checkpoint exists",
          flush=True)


def discard_replaced(workdir: Path) -> None:
    """Deletes what --overwrite set aside; call once the new run has a checkpoint."""
    replaced = workdir / REPLACED
    if replaced.exists():
        shutil.rmtree(replaced)
