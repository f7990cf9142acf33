"""`llmgw deploy PLAN --gateway URL`: hand a plan to a running gateway.

The gateway checks the plan itself and writes it over its plan file, so every worker
picks it up; this side only reads the file, sends it, and turns the answer into a sentence.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from urllib.parse import urlparse

import httpx

from llmgw.errors import LlmgwError, UsageError


class DeployRefused(LlmgwError):
    """The gateway answered, and said no."""


def deploy(plan: Path, gateway: str, token: str | None = None, timeout: float = 30.0) -> str:
    """Send `plan` to `gateway`'s POST /admin/plan; the digest it now serves, or an error."""
    token = token if token is not None else os.environ.get("LLMGW_ADMIN_TOKEN")
    if not token:
        raise UsageError("LLMGW_ADMIN_TOKEN is not set; export the gateway's admin token first.")
    try:
        text = plan.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read plan {plan}: {exc.strerror or exc}.") from None
    url = _admin_url(gateway)
    try:
        answer = httpx.post(
            url,
            content=text,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            timeout=timeout,
            trust_env=False,
        )
    except httpx.HTTPError as exc:
        reason = str(exc).rstrip(".") or type(exc).__name__
        raise UsageError(f"cannot reach the gateway at {url}: {reason}. Check --gateway.") from None
    if answer.status_code == 200:
        return str(answer.json()["digest"])
    if answer.status_code in (401, 403):
        # Nothing was judged: the plan was never read.
        raise DeployRefused(
            f"the gateway did not accept the token ({answer.status_code}); set LLMGW_ADMIN_TOKEN "
            "to the admin token the gateway was started with."
        )
    if answer.status_code in (404, 405):
        raise DeployRefused(
            f"nothing at {url} takes a plan ({answer.status_code}); --gateway must be the "
            "gateway's base URL, such as http://127.0.0.1:8080, with no path after it."
        )
    raise DeployRefused(f"the gateway refused the plan ({answer.status_code}): {_reason(answer)}")


def _admin_url(gateway: str) -> str:
    """POST /admin/plan under the gateway's base URL; a URL that cannot be it is a UsageError."""
    parsed = urlparse(gateway)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UsageError(
            f"--gateway {gateway} is not a URL the gateway could be at; write it as "
            "http://HOST:PORT, such as http://127.0.0.1:8080."
        )
    base = gateway.rstrip("/")
    if base.endswith("/v1"):
        # /v1 is where clients send OpenAI requests; the admin routes are beside it.
        raise UsageError(
            f"--gateway {gateway} ends in /v1, which is the path clients use; give the gateway's "
            f"base URL without it: {base.removesuffix('/v1')}."
        )
    return base + "/admin/plan"


def _reason(answer: httpx.Response) -> str:
    try:
        return str(answer.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return answer.text.strip()[:500] or answer.reason_phrase


def clear_text_warning(gateway: str) -> str | None:
    """A sentence for the person deploying when the admin token would cross a network in
    clear: http:// to anything but this machine. None for https or loopback."""
    try:
        url = httpx.URL(gateway)
    except httpx.InvalidURL:
        return None  # deploy says what is wrong with it
    if url.scheme != "http" or _is_loopback(url.host):
        return None
    return (
        f"warning: {gateway} is plain http on another machine, so LLMGW_ADMIN_TOKEN travels "
        "in clear and anyone on the path can deploy with it; put the gateway behind https."
    )


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost" or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: where it leads is up to DNS, so it may be anywhere
