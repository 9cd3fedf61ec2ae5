"""Checkpoints: one file per step, written atomically; keeps the last N and the best.

A checkpoint holds a pytree of arrays (model, optimizer, RNG) serialised with
flax's msgpack, and a JSON-serialisable `extra` dict (data position, step
counters). Each file is written under a temporary name, fsynced and renamed
into place, so a run killed mid-save still has its previous checkpoint. The
best step by a dev metric (lower is better) is recorded in best.json and is
never pruned.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import flax.serialization
import jax
import numpy as np

_NAME = re.compile(r"^step_(\d{9})\.msgpack$")


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class Checkpoints:
    """The checkpoints of one run, in `directory`."""

    def __init__(self, directory: str | Path, keep: int = 3, best_metric: str | None = None):
        if keep < 1:
            raise ValueError(f"keep must be at least 1; got {keep}")
        self.directory = Path(directory)
        self.keep = keep
        self.best_metric = best_metric  # None: no best checkpoint is tracked

    def discard_partial(self) -> None:
        """Deletes files a run killed mid-save left; call only while no process is saving."""
        for stale in self.directory.glob("*.tmp"):
            stale.unlink()

    def clear(self) -> int:
        """Deletes every checkpoint and the best record (a fresh run in an old directory); returns how many."""
        steps = self.steps()
        for step in steps:
            self.path(step).unlink()
        (self.directory / "best.json").unlink(missing_ok=True)
        return len(steps)

    def path(self, step: int) -> Path:
        return self.directory / f"step_{step:09d}.msgpack"

    def steps(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.directory.iterdir() if (m := _NAME.match(p.name)))

    def latest(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def best(self) -> dict | None:
        """{"step", "metric", "value"} of the best checkpoint so far, or None."""
        path = self.directory / "best.json"
        return json.loads(path.read_text()) if path.exists() else None

    def save(self, step: int, state: Any, extra: dict, metrics: dict | None = None) -> Path:
        """Writes `state` and `extra` for `step`; `metrics` may make it the new best."""
        payload = {
            "state": flax.serialization.to_state_dict(state),
            "extra": json.dumps(extra),
        }
        path = self.path(step)
        self.directory.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, flax.serialization.msgpack_serialize(payload))
        value = (metrics or {}).get(self.best_metric) if self.best_metric else None
        best = self.best()
        if value is not None and (best is None or value < best["value"] or best["step"] == step):
            record = {"step": step, "metric": self.best_metric, "value": float(value)}
            _atomic_write(self.directory / "best.json", json.dumps(record).encode())
        self._prune()
        return path

    def _prune(self) -> None:
        best = self.best()
        protected = set(self.steps()[-self.keep :]) | ({best["step"]} if best else set())
        for step in self.steps():
            if step not in protected:
                self.path(step).unlink()

    def read(self, step: int | None = None) -> tuple[dict, dict]:
        """(state as nested dicts of numpy arrays, extra) of `step` (default: the latest)."""
        if step is None:
            step = self.latest()
            if step is None:
                raise FileNotFoundError(f"no checkpoint in {self.directory}; train a model there first")
        path = self.path(step)
        if not path.exists():
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory} (have {self.steps()})")
        payload = flax.serialization.msgpack_restore(path.read_bytes())
        return payload["state"], json.loads(payload["extra"])

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict]:
        """(state shaped like `target`, extra) of `step` (default: the latest)."""
        state_dict, extra = self.read(step)
        state = flax.serialization.from_state_dict(target, state_dict)
        return _check_shapes(target, state), extra


def _check_shapes(target, state):
    """`state`, after checking each array against the shape and dtype `target` expects."""

    def check(path, want, got):
        want, got = np.asarray(want), np.asarray(got)
        if want.shape != got.shape or want.dtype != got.dtype:
            raise ValueError(
                f"checkpoint entry {jax.tree_util.keystr(path)} is {got.dtype}{list(got.shape)} but "
                f"{want.dtype}{list(want.shape)} is expected: the config changed since it was written"
            )
        return got

    return jax.tree_util.tree_map_with_path(check, target, state)


def load_variables(workdir: str | Path, checkpoint: str = "best") -> tuple[dict, int]:
    """(flax variables, step) of a run's checkpoint: "best" (by dev metric, else the latest), "latest" or a step."""
    checkpoints = Checkpoints(Path(workdir) / "checkpoints")
    if checkpoint == "best":
        step = (checkpoints.best() or {}).get("step")
    elif checkpoint == "latest":
        step = None
    else:
        step = int(checkpoint)
    state, _ = checkpoints.read(step)
    return {"params": state["params"], **state["model_state"]}, int(state["step"])
