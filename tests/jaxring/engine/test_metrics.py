"""Run-directory writers: metrics.jsonl across a resume, TensorBoard events, plots."""

import json

import pytest

from jaxring.engine import metrics
from jaxring.engine.task import MetricNames

NAMES = MetricNames(best="wer", plotted=("cer", "wer"), shown=("cer",), label="dev error rate (%)",
                    percent=("cer", "wer"))


def test_resume_drops_rows_after_the_checkpoint(tmp_path):
    log = metrics.RunLog(tmp_path)
    for step in (10, 20, 30):
        log.write({"step": step, "loss": 1.0 / step, "dev_cer": 0.5 if step == 20 else None})
    log.close()
    log = metrics.RunLog(tmp_path, resume_step=20)
    log.write({"step": 30, "loss": 0.01})
    log.close()
    rows = metrics.read_rows(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["loss"]) for r in rows] == [(10, 0.1), (20, 0.05), (30, 0.01)]
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tensorboard").iterdir())


def test_fresh_run_starts_an_empty_file(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 99}) + "\n")
    metrics.RunLog(tmp_path).close()
    assert metrics.read_rows(tmp_path / "metrics.jsonl") == []


def test_plots(tmp_path):
    rows = [{"step": s, "loss": 10.0 / s} for s in range(1, 50)] + [{"step": 50, "dev_cer": 0.2, "dev_wer": 0.4}]
    written = metrics.plot_curves(rows, tmp_path, NAMES)
    assert [p.name for p in written] == ["loss.png", "dev_metrics.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)
    assert metrics.plot_curves([{"step": 1, "loss": 1.0}], tmp_path / "only_loss", NAMES)[0].name == "loss.png"


def test_throughput_of_a_resume_from_a_checkpoint_without_totals_is_unknown_for_the_whole_run():
    throughput = metrics.Throughput(None, resumed_at_step=40)
    throughput.start()
    throughput.add(16)
    throughput.stop()
    summary = throughput.summary()
    assert summary["examples"] is None and summary["train_seconds"] is None and summary["examples_per_s"] is None
    assert summary["examples_since_resume"] == 16 and summary["resumed_at_step"] == 40
    assert summary["examples_per_s_since_resume"] == pytest.approx(16 / summary["train_seconds_since_resume"])
    assert throughput.totals() is None
