"""What a run leaves in its directory: metrics.jsonl, TensorBoard events, summary, plots.

TensorBoard events and plots need tensorboardX and matplotlib (the `report`
extra of pyproject.toml installs them, `pip install 'jaxring[report]'`, and
tensorboard to read the events:
`tensorboard --logdir RUN/tensorboard`); without them a run writes
metrics.jsonl and summary.json only, and says so once.
"""

from __future__ import annotations

import importlib.util
import json
import math
import time
from pathlib import Path

from jaxring.engine.task import MetricNames


def _missing(module: str, what: str) -> bool:
    """True (after a note) when optional `module`, needed for `what`, is not installed."""
    if importlib.util.find_spec(module) is not None:
        return False
    print(f"note: {module} is not installed, so the run writes no {what} (pip install {module}, or the "
          "engine's `report` extra: pip install 'jaxring[report]')", flush=True)
    return True


class RunLog:
    """One JSON object per logged step in DIR/metrics.jsonl, mirrored to TensorBoard.

    On resume from step S the rows after S are dropped (the resumed run
    writes them again), so the file reads as if the run had never stopped.
    Row S itself is `resumed_row`, the one saved in S's checkpoint, when given:
    a run stopped between writing the checkpoint and the row loses neither.
    """

    def __init__(self, workdir: str | Path, resume_step: int | None = None, resumed_row: dict | None = None):
        self.workdir = Path(workdir)
        self.path = self.workdir / "metrics.jsonl"
        kept = []
        if resume_step is not None:
            kept = [row for row in self.rows() if row["step"] < resume_step]
            kept += [resumed_row] if resumed_row else [row for row in self.rows() if row["step"] == resume_step]
        self.path.write_text("".join(json.dumps(row) + "\n" for row in kept))
        self._file = open(self.path, "a")
        purge = None if resume_step is None else resume_step + 1
        self._writer = None
        if not _missing("tensorboardX", "TensorBoard events"):
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(str(self.workdir / "tensorboard"), purge_step=purge)

    def rows(self) -> list[dict]:
        return read_rows(self.path)

    def write(self, row: dict) -> None:
        """Appends `row` (it must have "step"); numbers also go to TensorBoard."""
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._writer is None:
            return
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                self._writer.add_scalar(key, value, row["step"])

    def close(self) -> None:
        self._file.close()
        if self._writer is not None:
            self._writer.close()


def read_rows(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_json(path: str | Path, values: dict) -> None:
    Path(path).write_text(json.dumps(values, indent=2) + "\n")


SMOOTHING = 0.9  # weight of the past in the loss's smoothed curve (TensorBoard's slider, same formula)


def smoothed(values: list[float], weight: float = SMOOTHING) -> list[float]:
    """Exponential moving average, debiased as TensorBoard's: the first values are not pulled to 0."""
    average, out = 0.0, []
    for n, value in enumerate(values, 1):
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight**n))
    return out


def curve_figures(rows: list[dict], metrics: MetricNames, run_name: str) -> dict:
    """{file name: matplotlib Figure} of the logged rows: the training loss (raw, and smoothed once
    there are enough points to smooth) and the task's dev metrics, titled with `run_name`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = (  # file name, title, y label, the row keys drawn as curves
        ("loss.png", "training loss", "training loss", ("loss",)),
        ("dev_metrics.png", "dev metrics", metrics.label, tuple(f"dev_{name}" for name in metrics.plotted)),
    )
    last_step = max((r["step"] for r in rows), default=0)
    figures = {}
    for name, title, ylabel, keys in plots:
        curves = {k: [(r["step"], r[k]) for r in rows if r.get(k) is not None] for k in keys}
        curves = {k: points for k, points in curves.items() if points}
        if not curves:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for key, points in curves.items():
            steps, values = zip(*points)
            scale = 100.0 if key.removeprefix("dev_") in metrics.percent else 1.0  # rates as percentages
            values = [v * scale for v in values]
            if len(points) == 1:  # one evaluation: a point with its value written beside it
                (line,) = ax.plot(steps, values, "o", label=f"{key} {values[0]:.1f}")
                ax.annotate(f"{values[0]:.1f}", (steps[0], values[0]), textcoords="offset points", xytext=(6, 6),
                            color=line.get_color())
            elif key == "loss" and len(points) >= 10:
                (line,) = ax.plot(steps, values, alpha=0.3, label=f"{key} (raw)")
                ax.plot(steps, smoothed(values), color=line.get_color(), label=f"{key} (smoothed {SMOOTHING})")
            else:
                ax.plot(steps, values, marker="o" if len(points) < 30 else None, label=key)
        if all(len(points) == 1 for points in curves.values()):
            title += f" (one evaluation, step {last_step})" if name == "dev_metrics.png" else " (one logged step)"
        ax.set_title(f"{run_name}: {title}")
        ax.set_xlabel("step")
        ax.set_xlim(0, max(last_step, 1) * 1.05)
        ax.set_ylabel(ylabel)
        if name == "loss.png":
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        figures[name] = fig
    return figures


def plot_curves(rows: list[dict], out_dir: str | Path, metrics: MetricNames, run_name: str | None = None) -> list[Path]:
    """PNG curves of the logged rows (curve_figures) in `out_dir`; returns the files written.
    `run_name`: the titles' run, by default the name of the folder holding `out_dir` (the run directory)."""
    if _missing("matplotlib", "plots"):
        return []
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in curve_figures(rows, metrics, run_name or out_dir.resolve().parent.name).items():
        fig.savefig(out_dir / name, dpi=100)
        plt.close(fig)
        written.append(out_dir / name)
    return written


class Throughput:
    """Examples trained and seconds spent in the training loop, this session and the whole run.

    The loop's seconds run from before the first step (its compilation
    included) to the end of the last, dev evaluations and checkpoints in
    between included. The whole run's totals continue across resumes through
    `totals()`, which the trainer stores in each checkpoint.
    """

    def __init__(self, before: dict | None, resumed_at_step: int | None = None):
        """`before`: `totals()` of the sessions before this one (None: not recorded, so the whole run is unknown)."""
        self.before = before
        self.resumed_at_step = resumed_at_step
        self.examples = 0
        self._started = self._stopped = None

    def start(self) -> None:
        self._started = time.perf_counter()

    def add(self, examples: int) -> None:
        self.examples += examples

    def stop(self) -> None:
        self._stopped = time.perf_counter()

    def seconds(self) -> float:
        """This session's seconds in the loop so far."""
        if self._started is None:
            return 0.0
        return (self._stopped if self._stopped is not None else time.perf_counter()) - self._started

    def totals(self) -> dict | None:
        """{"examples", "seconds"} of the whole run so far; None when an earlier session did not record them."""
        if self.before is None:
            return None
        return {"examples": self.before["examples"] + self.examples, "seconds": self.before["seconds"] + self.seconds()}

    def summary(self) -> dict:
        """summary.json's throughput: the whole run's, and this session's too when it resumed."""
        whole = self.totals() or {"examples": None, "seconds": None}
        values = {
            "examples": whole["examples"],
            "train_seconds": whole["seconds"],
            "examples_per_s": _rate(whole["examples"], whole["seconds"]),
        }
        if self.resumed_at_step is not None:
            values.update(
                resumed_at_step=self.resumed_at_step,
                examples_since_resume=self.examples,
                train_seconds_since_resume=self.seconds(),
                examples_per_s_since_resume=_rate(self.examples, self.seconds()),
            )
        return values


def _rate(examples: int | None, seconds: float | None) -> float | None:
    return examples / seconds if examples is not None and seconds else None
