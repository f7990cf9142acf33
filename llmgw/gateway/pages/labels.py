"""How the dashboard's figures read to people: sizes, ages, durations, rates and contexts as
labels, the same on every page and in the JSON the page refreshes from."""

from __future__ import annotations

from datetime import UTC, datetime


def gb_label(gb: float) -> str:
    return f"{gb:.1f}".removesuffix(".0")


def utc_iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def relative_age(seconds: float) -> str:
    """'just now', '42 s ago', '5 min ago', '3 h ago', '2 d ago'."""
    s = max(0, int(seconds))
    if s < 5:
        return "just now"
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if s >= size:
            return f"{s // size} {unit} ago"
    return f"{s} s ago"


def context_label(tokens: int) -> str:
    # Context windows are powers of two in practice; "128K" reads faster than 131,072.
    if tokens >= 1024 and tokens % 1024 == 0:
        return f"{tokens // 1024}K"
    return f"{tokens:,}"


def seconds_label(seconds: float) -> str:
    """'180 ms', '1.2 s', '42 s': as precise as a median read from buckets deserves."""
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    return f"{round(seconds)} s"


def rate_label(value: float) -> str:
    if value == 0:
        return "0"
    return f"{value:.1f}" if value < 10 else f"{round(value):,}"


def median_label(value: float | None, over: bool) -> str:
    if value is None:
        return "–"
    return f"> {seconds_label(value)}" if over else f"≈ {seconds_label(value)}"
