import pytest

from jaxring.engine import timing


@pytest.mark.parametrize("warmup", [0, 1, 2])
def test_median_of_the_timed_calls_after_the_untimed_warmup(monkeypatch, warmup):
    clock = iter(range(1000))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: float(next(clock)))
    calls = []
    # Each call advances the fake clock by 0, 1, 2, ... extra ticks, so durations are 1, 2, 3, ... ticks.
    def fn():
        for _ in range(len(calls) - warmup):
            next(clock)
        calls.append(1)
        return calls

    median = timing.median_seconds(fn, repeats=5, warmup=warmup)
    assert len(calls) == 5 + warmup
    assert median == 3.0  # durations 1..5 ticks: the warm-up calls are not timed


def test_by_default_one_untimed_call_compiles_before_the_timed_ones():
    calls = []
    timing.median_seconds(lambda: calls.append(1) or len(calls), repeats=3)
    assert len(calls) == 3 + 1
