"""Checkpoints: one verified file per step, written atomically; keeps the last N and the best.

A checkpoint holds a pytree of arrays (model, optimizer, RNG) serialised with
flax's msgpack, and a JSON-serialisable `extra` dict (data position, the
step's metrics row). The file wraps that payload with the SHA-256 of its
bytes. State that is not finite is never written, and is refused on reading
(a file written by hand or by another tool is rechecked, not trusted).
Each file is written under a temporary name, fsynced, renamed into place and
read back, so a run killed mid-save still has its previous checkpoint and
pruning never removes the newest verified one. The best step by a dev
metric (lower is better) is recorded, with those metrics, in best.json and is
never pruned.

What reading does when a file is damaged (truncated, bit-flipped, not
finite) depends on what is asked for (docs/ARCHITECTURE.md, "Checkpoint
contract"):

- a step by number: that step's weights or an error, never a substitute;
- LATEST: the newest intact checkpoint; each damaged newer one is named on
  stderr and skipped (a resume from an earlier step repeats steps, exactly);
- BEST: best.json's step (LATEST when no best is recorded); a damaged best
  falls back to LATEST, named on stderr. The caller learns which step it got
  (`Loaded.step`) and must report that step, not best.json's, next to any
  number computed from those weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple

import flax.serialization
import jax
import numpy as np

_NAME = re.compile(r"^step_(\d{9})\.msgpack$")
# Version 2: {"format", "sha256", "payload"}; the payload is the msgpack of {"state", "extra"}.
_FORMAT = 2

LATEST = "latest"  # the newest intact checkpoint
BEST = "best"  # the best one by the dev metric (best.json), else LATEST


class Loaded(NamedTuple):
    """A checkpoint read back: its state (nested dicts of numpy arrays), its extra dict, and its step."""

    state: dict
    extra: dict
    step: int


class CheckpointError(ValueError):
    """A checkpoint file that cannot be trusted: damaged, incomplete or from another format."""


def _non_finite_leaves(state_dict) -> list[str]:
    """Paths of the floating-point arrays of `state_dict` holding a NaN or an infinity."""
    bad = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(state_dict)[0]:
        array = np.asarray(leaf)
        if np.issubdtype(array.dtype, np.inexact) and not np.isfinite(array).all():
            bad.append(jax.tree_util.keystr(path))
    return bad


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

    def path(self, step: int) -> Path:
        return self.directory / f"step_{step:09d}.msgpack"

    def steps(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.directory.iterdir() if (m := _NAME.match(p.name)))

    def best(self) -> dict | None:
        """{"step", "metric", "value"} of the best checkpoint so far, or None."""
        path = self.directory / "best.json"
        return json.loads(path.read_text()) if path.exists() else None

    def save(self, step: int, state: Any, extra: dict, metrics: dict | None = None) -> Path:
        """Writes `state` and `extra` for `step`; `metrics` may make it the new best.

        Raises FloatingPointError, writing nothing, if a floating-point array of
        `state` is not finite.
        """
        state_dict = flax.serialization.to_state_dict(state)
        if bad := _non_finite_leaves(state_dict):
            raise FloatingPointError(
                f"not saving the checkpoint of step {step}: {', '.join(bad[:5])} hold NaN or infinity "
                "(the training diverged; the checkpoints already written are intact)"
            )
        payload = flax.serialization.msgpack_serialize({"state": state_dict, "extra": json.dumps(extra)})
        wrapped = {"format": _FORMAT, "sha256": hashlib.sha256(payload).hexdigest(), "payload": payload}
        path = self.path(step)
        self.directory.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, flax.serialization.msgpack_serialize(wrapped))
        self._verify(path)  # read back: pruning below relies on this file being intact
        self.update_best(step, metrics)
        self._prune(keep_also=step)
        return path

    def update_best(self, step: int, metrics: dict | None) -> None:
        """Makes `step` the best checkpoint if its `metrics` beat the record (or it holds the record).

        Also called on resume with the metrics saved in the checkpoint, for a run
        stopped between writing a checkpoint and its best.json.
        """
        value = (metrics or {}).get(self.best_metric) if self.best_metric else None
        best = self.best()
        if value is not None and (best is None or value < best["value"] or best["step"] == step):
            record = {"step": step, "metric": self.best_metric, "value": float(value), "metrics": metrics}
            _atomic_write(self.directory / "best.json", json.dumps(record).encode())

    def _prune(self, keep_also: int) -> None:
        best = self.best()
        protected = set(self.steps()[-self.keep :]) | {keep_also} | ({best["step"]} if best else set())
        for step in self.steps():
            if step not in protected:
                self.path(step).unlink()

    def read(self, which: int | str = LATEST) -> Loaded:
        """The verified checkpoint `which` names: a step number, LATEST or BEST (module docstring).

        A step asked for by number that is damaged raises CheckpointError;
        LATEST and BEST fall back as the module docstring says, naming each
        damaged file on stderr. FileNotFoundError when there is nothing to read.
        """
        if which == BEST:
            best = self.best()
            if best is None:
                return self.read(LATEST)
            try:
                return self.read(best["step"])
            except (CheckpointError, FileNotFoundError) as e:
                print(f"warning: {e}; using the newest intact checkpoint instead of the best one",
                      file=sys.stderr, flush=True)
                return self.read(LATEST)
        if which != LATEST:
            step = _step_number(which)
            path = self.path(step)
            if not path.exists():
                raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory} (have {self.steps()})")
            return Loaded(*self._verify(path), step)
        steps = self.steps()
        if not steps:
            raise FileNotFoundError(f"no checkpoint in {self.directory}; train a model there first")
        damaged = []
        for candidate in reversed(steps):
            try:
                return Loaded(*self._verify(self.path(candidate)), candidate)
            except CheckpointError as e:
                damaged.append(str(e))
                print(f"warning: {e}; trying the previous checkpoint", file=sys.stderr, flush=True)
        raise CheckpointError(f"no intact checkpoint in {self.directory}: " + "; ".join(damaged))

    def _verify(self, path: Path) -> tuple[dict, dict]:
        """(state dict, extra) of the checkpoint file at `path`, or CheckpointError naming it and what is wrong."""
        try:
            wrapped = flax.serialization.msgpack_restore(path.read_bytes())
        except Exception as e:  # msgpack raises several unrelated types for damaged bytes
            raise CheckpointError(f"checkpoint {path} is damaged ({type(e).__name__}: {e})") from None
        if not isinstance(wrapped, dict) or wrapped.get("format") != _FORMAT:
            raise CheckpointError(
                f"checkpoint {path} is not a verified checkpoint of format {_FORMAT} "
                "(damaged, or written by an older jaxring)"
            )
        payload = wrapped.get("payload")
        if not isinstance(payload, bytes) or hashlib.sha256(payload).hexdigest() != wrapped.get("sha256"):
            raise CheckpointError(f"checkpoint {path} is damaged: its bytes do not match the SHA-256 recorded in it")
        try:
            inner = flax.serialization.msgpack_restore(payload)
            state, extra = inner["state"], json.loads(inner["extra"])
        except Exception as e:
            raise CheckpointError(f"checkpoint {path} holds an unreadable payload ({type(e).__name__}: {e})") from None
        if bad := _non_finite_leaves(state):
            raise CheckpointError(f"checkpoint {path} holds non-finite values in {', '.join(bad[:5])}")
        return state, extra

    def restore(self, target: Any, which: int | str = LATEST) -> tuple[Any, dict]:
        """(state shaped like `target`, extra) of read(which); every array must have target's shape and dtype."""
        state_dict, extra, _ = self.read(which)
        state = flax.serialization.from_state_dict(target, state_dict)
        return _check_shapes(target, state), extra


def unserialisable(tree) -> list[str]:
    """What of `tree` the checkpoint format cannot write, one "path: why" each (empty: it all can).

    Checkpoints hold flax's state dict of the tree: nested dicts, lists and tuples of numeric arrays. A
    typed PRNG key, an object array, or a container flax does not know (an nnx.State) is named here.
    """
    problems = []

    def walk(path, node):
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{path}[{key!r}]", value)
        elif isinstance(node, (list, tuple)):
            for index, value in enumerate(node):
                walk(f"{path}[{index}]", value)
        elif node is not None and (why := _unwritable(node)):
            problems.append(f"{path or 'the state'}: {why}")

    walk("", flax.serialization.to_state_dict(tree))
    return problems


def _unwritable(leaf) -> str | None:
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return "a typed PRNG key (store its jax.random.key_data, a uint32 array, and wrap it again in the loss)"
    if isinstance(leaf, (int, float, bool, np.number, np.bool_)) or (dtype is not None and hasattr(leaf, "shape")):
        return None if np.asarray(leaf).dtype != object else "an object array"
    return f"a {type(leaf).__module__}.{type(leaf).__qualname__}, not an array"


def _step_number(which) -> int:
    if isinstance(which, bool) or not isinstance(which, (int, np.integer)):
        raise ValueError(f"a checkpoint is a step number, {LATEST!r} or {BEST!r}; got {which!r}")
    return int(which)


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


def load_variables(workdir: str | Path, checkpoint: int | str = BEST) -> tuple[dict, int]:
    """(flax variables, step) of a run's checkpoint: BEST, LATEST or a step (as text or a number).

    The step returned is the one whose weights these are: with BEST and a
    damaged best checkpoint, the newest intact one's (Checkpoints.read).
    """
    which = checkpoint if checkpoint in (BEST, LATEST) else int(checkpoint)
    state, _, step = Checkpoints(Path(workdir) / "checkpoints").read(which)
    return {"params": state["params"], **state["model_state"]}, step
