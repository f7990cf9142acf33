"""The rate limiter on its own: the sliding window, the refusal, and OpenAI's reset format."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.gateway.errors import ApiError
from llmgw.gateway.request.limits import LocalLimiter, duration
from llmgw.gateway.state.keys import Tenant


def test_reset_durations_are_written_as_openai_writes_them() -> None:
    assert [duration(s) for s in (0.25, 1, 59.2, 60, 360)] == ["250ms", "1s", "1m0s", "1m0s", "6m0s"]


def test_a_key_without_limits_is_not_counted(tmp_path: Path) -> None:
    assert LocalLimiter(tmp_path).admit(Tenant("free")) is None


def test_two_limiters_on_one_file_share_the_count(tmp_path: Path) -> None:
    # Two workers are two processes, each with its own connection to the file.
    first, second = LocalLimiter(tmp_path), LocalLimiter(tmp_path)
    tenant = Tenant("t", rpm=3)
    first.admit(tenant)
    second.admit(tenant)
    window = first.admit(tenant)
    assert window is not None and window.headers()["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(ApiError) as refused:
        second.admit(tenant)
    assert refused.value.status == 429 and refused.value.type == "requests"
    assert refused.value.headers["x-ratelimit-limit-requests"] == "3"


def test_tokens_are_charged_and_refuse_once_over(tmp_path: Path) -> None:
    limiter, tenant = LocalLimiter(tmp_path), Tenant("t", tpm=10)
    limiter.admit(tenant)
    limiter.charge(tenant, 10)
    with pytest.raises(ApiError) as refused:
        limiter.admit(tenant)
    assert refused.value.type == "tokens"
    assert 1 <= int(refused.value.headers["Retry-After"]) <= 60
