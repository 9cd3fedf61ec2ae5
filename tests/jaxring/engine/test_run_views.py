"""What a user looks at after a run: the plots (titled, loss smoothed, one evaluation readable)
and the TensorBoard events, read back with tensorboard's own reader."""

import numpy as np
import pytest

from jaxring.engine import metrics
from jaxring.engine.task import MetricNames

NAMES = MetricNames(best="cer", plotted=("cer", "wer"), shown=("cer",), label="dev error rate (%)", percent=("cer", "wer"))


def test_smoothing_is_tensorboards_debiased_moving_average():
    values = list(np.random.default_rng(3).uniform(1, 5, 17))
    expected, biased = [], 0.0
    for n, value in enumerate(values, 1):  # TensorBoard's formula, written out in float64
        biased = 0.6 * biased + 0.4 * value
        expected.append(biased / (1 - 0.6**n))
    np.testing.assert_allclose(metrics.smoothed(values, 0.6), expected, rtol=1e-12)
    assert metrics.smoothed([3.0])[0] == pytest.approx(3.0)  # not pulled towards 0


def test_plots_name_the_run_and_smooth_the_loss(tmp_path):
    rng = np.random.default_rng(0)
    rows = [{"step": s, "loss": 10.0 / s * rng.uniform(0.5, 1.5)} for s in range(1, 41)]
    rows += [{"step": 20, "dev_cer": 0.6, "dev_wer": 1.01}, {"step": 40, "dev_cer": 0.4, "dev_wer": 1.02}]
    figures = metrics.curve_figures(rows, NAMES, "mine")
    loss = figures["loss.png"].axes[0]
    assert loss.get_title() == "mine: training loss"
    assert [line.get_label() for line in loss.get_lines()] == ["loss (raw)", "loss (smoothed 0.9)"]
    raw, smooth = (line.get_ydata() for line in loss.get_lines())
    assert np.std(np.diff(smooth)) < np.std(np.diff(raw))  # the smoothed line is the calmer one
    dev = figures["dev_metrics.png"].axes[0]
    assert dev.get_title() == "mine: dev metrics" and [l.get_label() for l in dev.get_lines()] == ["dev_cer", "dev_wer"]
    written = metrics.plot_curves(rows, tmp_path / "run_x" / "plots", NAMES)
    assert [p.name for p in written] == ["loss.png", "dev_metrics.png"]


def test_a_single_evaluation_is_a_labelled_point_on_the_runs_whole_length():
    rows = [{"step": s, "loss": 5.0 / s} for s in range(1, 51)] + [{"step": 50, "dev_cer": 0.818, "dev_wer": 1.016}]
    dev = metrics.curve_figures(rows, NAMES, "mine")["dev_metrics.png"].axes[0]
    assert dev.get_title() == "mine: dev metrics (one evaluation, step 50)"
    assert [line.get_label() for line in dev.get_lines()] == ["dev_cer 81.8", "dev_wer 101.6"]
    assert [text.get_text() for text in dev.texts] == ["81.8", "101.6"]
    assert dev.get_xlim()[0] == 0 and dev.get_xlim()[1] >= 50


def test_tensorboard_reads_the_events_of_a_run(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator as accumulator  # the `report` extra's
    log = metrics.RunLog(tmp_path)
    losses = np.random.default_rng(1).uniform(0.5, 3.0, 6)
    for step, loss in enumerate(losses, 1):
        log.write({"step": step, "loss": float(loss), **({"dev_cer": 0.25} if step == 6 else {})})
    log.close()
    events = accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [
        (step, pytest.approx(loss, rel=1e-6)) for step, loss in enumerate(losses, 1)]
    assert [(e.step, e.value) for e in events.Scalars("dev_cer")] == [(6, 0.25)]
