"""Per model, over the last minute: requests per minute, median latency and time to first
token, tokens per second; for the dashboard, from the metrics every worker writes.

The metrics are running totals summed over the workers, so a figure for the last minute is
the difference between the totals now and the totals a minute ago. Those older readings
are kept in one small file in the directory the workers share (`Samples`): whichever
worker finds the newest reading over SAMPLE_EVERY old adds one, so every worker's page
measures from the same readings, and a worker gunicorn has just started knows the last
minute as well as the others do. Nothing here runs per request: the readings are taken by
a background task, and the figures are worked out when a page asks for them.

Medians come from histogram buckets, interpolated within the bucket the middle request
fell in (as Prometheus's histogram_quantile does): estimates, and the page says so with ≈.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from llmgw.atomic import file_signature, replace_file
from llmgw.gateway.state import metrics

log = logging.getLogger("llmgw.gateway")

WINDOW = 60.0
SAMPLE_EVERY = 10.0
FILE_NAME = "llmgw-usage-readings.json"

Totals = dict[str, dict[str, float]]  # model -> field -> running total (metrics.model_totals)


@dataclass(frozen=True)
class ModelFigures:
    requests: int  # in the window
    rpm: float
    tokens_per_second: float  # generated (completion) tokens
    prompt_tokens_per_second: float
    latency_median: float | None  # seconds; None without requests
    latency_over: bool  # the median is past the last bucket: it is at least latency_median
    ttft_median: float | None  # None without streamed answers
    ttft_over: bool


@dataclass(frozen=True)
class Figures:
    """Every model's figures over `seconds` (up to WINDOW; less while the gateway is young)."""

    seconds: float
    models: Mapping[str, ModelFigures]


class Samples:
    """The shared readings of the running totals, at most a little over WINDOW old."""

    def __init__(self, directory: Path, collect: Callable[[], Totals] = metrics.model_totals) -> None:
        self.path = directory / FILE_NAME
        self.collect = collect

    def read(self) -> list[tuple[float, Totals]]:
        try:
            doc = json.loads(self.path.read_bytes())
            return [(float(at), totals) for at, totals in doc["readings"]]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Rewritten within SAMPLE_EVERY by whichever worker reads it next.
            log.warning("cannot read the usage readings at %s: %s", self.path, exc)
            return []

    def take(self, now: float | None = None) -> None:
        """Add a reading unless another worker added one within SAMPLE_EVERY."""
        now = time.time() if now is None else now
        written = file_signature(self.path)
        # The file's age answers whether a reading is due without parsing it: on a large
        # fleet it is megabytes, and every worker asks every SAMPLE_EVERY.
        if written is not None and 0 <= now - written[3] / 1e9 < SAMPLE_EVERY * 0.9:
            return
        readings = self.read()
        if readings and now - readings[-1][0] < SAMPLE_EVERY * 0.9:
            return
        readings.append((now, self.collect()))
        # Keep the newest reading at least WINDOW old (the baseline) and those after it.
        old = [i for i, (at, _) in enumerate(readings) if at <= now - WINDOW]
        if old:
            readings = readings[old[-1] :]
        try:
            replace_file(self.path, json.dumps({"readings": readings}).encode(), tag="readings", owned=True)
        except OSError as exc:
            log.warning("cannot keep usage readings at %s: %s", self.path, exc)

    async def watch(self) -> None:
        while True:
            try:
                # Reading every worker's metric files takes a while on a large fleet.
                await asyncio.to_thread(self.take)
            except Exception:  # one bad reading must not end them for good
                log.exception("taking a usage reading failed")
            await asyncio.sleep(SAMPLE_EVERY)

    def figures(self, now: float | None = None) -> Figures | None:
        """The last minute's figures; None before the first reading."""
        now = time.time() if now is None else now
        readings = self.read()
        if not readings:
            return None
        baseline = readings[0]
        for reading in readings:
            if reading[0] <= now - WINDOW:
                baseline = reading
        at, before = baseline
        seconds = max(now - at, 1.0)
        current = self.collect()
        return Figures(seconds, {m: model_figures(t, before.get(m, {}), seconds) for m, t in current.items()})


def model_figures(now: Mapping[str, float], before: Mapping[str, float], seconds: float) -> ModelFigures:
    def grew(field: str) -> float:
        # A total that went down belongs to a metrics directory emptied since: all is new.
        value = now.get(field, 0.0)
        return value - before.get(field, 0.0) if value >= before.get(field, 0.0) else value

    requests = grew("requests")
    latency, latency_over = median(_buckets(now, before, "latency"))
    ttft, ttft_over = median(_buckets(now, before, "ttft"))
    return ModelFigures(
        requests=round(requests),
        rpm=requests * 60.0 / seconds,
        tokens_per_second=grew("completion_tokens") / seconds,
        prompt_tokens_per_second=grew("prompt_tokens") / seconds,
        latency_median=latency,
        latency_over=latency_over,
        ttft_median=ttft,
        ttft_over=ttft_over,
    )


def _buckets(now: Mapping[str, float], before: Mapping[str, float], name: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count within the window), by bound."""
    prefix = f"{name}<="
    out = []
    for field, value in now.items():
        if field.startswith(prefix):
            was = before.get(field, 0.0)
            out.append((float(field[len(prefix) :]), value - was if value >= was else value))
    return sorted(out)


def median(buckets: list[tuple[float, float]]) -> tuple[float | None, bool]:
    """The median from cumulative bucket counts, and whether it lies past the last finite
    bound (then the bound is returned: the median is at least that)."""
    if not buckets or buckets[-1][1] <= 0:
        return None, False
    rank = buckets[-1][1] / 2
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower, True
            if count == below:
                return bound, False
            return lower + (bound - lower) * (rank - below) / (count - below), False
        lower, below = bound, count
    return lower, True
