"""The dashboard's last-minute figures: medians from buckets, and readings shared by workers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from llmgw.gateway.state.rates import SAMPLE_EVERY, WINDOW, Samples, Totals, median, model_figures

INF = math.inf


def test_the_median_is_interpolated_within_the_bucket_the_middle_request_fell_in() -> None:
    # Four requests between 100 ms and 200 ms: the middle one is taken to be half-way.
    assert median([(0.1, 0), (0.2, 4), (INF, 4)]) == (pytest.approx(0.15), False)
    # Rank 1.5 of 3: a quarter of the way into the 200-500 ms bucket, which holds two.
    assert median([(0.1, 1), (0.2, 1), (0.5, 3), (INF, 3)])[0] == pytest.approx(0.275)


def test_a_median_past_the_last_bound_is_that_bound_and_says_so() -> None:
    assert median([(0.1, 0), (300, 1), (INF, 5)]) == (300, True)


def test_no_requests_have_no_median() -> None:
    assert median([]) == (None, False)
    assert median([(0.1, 0), (INF, 0)]) == (None, False)


def test_figures_are_what_grew_in_the_window() -> None:
    before = {"requests": 10, "completion_tokens": 100, "latency<=1.0": 5, "latency<=+Inf": 10}
    now = {"requests": 40, "completion_tokens": 700, "latency<=1.0": 35, "latency<=+Inf": 40}
    figures = model_figures(now, before, 60)
    assert figures.requests == 30 and figures.rpm == 30
    assert figures.tokens_per_second == 10
    assert figures.latency_median is not None and figures.latency_median < 1
    assert figures.ttft_median is None, "no streamed answers, no time to first token"


class Counting:
    """Running totals that grow by one request a second: what the metrics would say."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> Totals:
        return {"chat": {"requests": self.now}}


def test_every_worker_measures_from_the_same_readings_a_minute_back(tmp_path: Path) -> None:
    totals = Counting()
    one, other = Samples(tmp_path, totals), Samples(tmp_path, totals)  # two workers
    for second in range(0, 100, 5):
        totals.now = float(second)
        for worker in (one, other):
            worker.take(now=float(second))
    readings = one.read()
    assert [at for at, _ in readings] == sorted(at for at, _ in readings)
    gaps = [b - a for (a, _), (b, _) in zip(readings, readings[1:], strict=False)]
    assert all(gap >= SAMPLE_EVERY * 0.9 for gap in gaps), "both workers took the same reading"
    assert readings[0][0] <= 95 - WINDOW < readings[1][0], "readings older than the baseline are kept"
    totals.now = 97.0
    for worker in (one, other):
        figures = worker.figures(now=97.0)
        assert figures is not None
        assert figures.seconds >= WINDOW and figures.models["chat"].rpm == pytest.approx(60, rel=0.2)


def test_a_young_gateway_measures_from_its_first_reading(tmp_path: Path) -> None:
    totals = Counting()
    samples = Samples(tmp_path, totals)
    assert samples.figures(now=0) is None
    samples.take(now=0)
    totals.now = 20
    figures = samples.figures(now=20)
    assert figures is not None and figures.seconds == 20 and figures.models["chat"].requests == 20


def test_a_worker_finds_a_fresh_reading_from_the_files_age_without_reading_the_metrics(
    tmp_path: Path,
) -> None:
    Samples(tmp_path, Counting()).take()

    def never() -> Totals:
        raise AssertionError("a second worker read the metrics again within SAMPLE_EVERY")

    Samples(tmp_path, never).take()


def test_gunicorn_empties_the_readings_with_the_metrics_they_were_taken_from() -> None:
    from llmgw.gateway.server import gunicorn_conf
    from llmgw.gateway.state import rates

    assert gunicorn_conf.USAGE_READINGS == rates.FILE_NAME
