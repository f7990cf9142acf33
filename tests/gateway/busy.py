"""A busy model for the scheduling tests and bench/fairness.py: a stand-in engine with slots
(fake_engine.py's `--parallel N --service-time S`), a gateway whose plan says `--parallel N`
for it, keys with shares and priorities, and clients that flood or ask one at a time.

Each request's `fake_tag` names who sent it (the key's name unless told otherwise), so the
engine's `served` list says in which order keys were served.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from harness import Engine, Gateway, Load, engine, gateway, key_digest, model, plan, profile, write_plan

S = 0.08  # seconds each request takes in one of the engine's slots
KEYS = {
    "quiet": "",
    "flood": "",
    "batch": "",
    "one": "share: 1, ",
    "three": "share: 3, ",
    "few": "",
    "many": "",
    "high": "priority: high, ",
}


def secret(name: str) -> str:
    return f"sk-{name}"


def keys_yaml() -> str:
    return "keys:\n" + "".join(
        f"  - {{name: {name}, {extra}sha256: {key_digest(secret(name))}}}\n" for name, extra in KEYS.items()
    )


@contextlib.contextmanager
def slots(parallel: int, host: str = "127.0.0.7", service_s: float = S) -> Iterator[Engine]:
    with engine("slots", host, "--parallel", str(parallel), "--service-time", str(service_s)) as e:
        yield e


def write_files(tmp: Path, endpoints: list[str], parallel: int) -> dict[str, str]:
    """The plan (one model, `chat`, its profile saying `--parallel N`) and keys.yaml; the
    gateway's environment naming the keys file."""
    path = tmp / "plan.json"
    args = ("--parallel", str(parallel))
    write_plan(path, plan([model("chat", [profile(endpoints, "chat", args=args)])]))
    (tmp / "keys.yaml").write_text(keys_yaml())
    return {"LLMGW_KEYS_FILE": str(tmp / "keys.yaml")}


@contextlib.contextmanager
def served(tmp: Path, e: Engine, parallel: int, **env: str) -> Iterator[Gateway]:
    with gateway(tmp / "plan.json", **write_files(tmp, [e.url], parallel), **env) as gw:
        yield gw


def body(tag: str, **extra: Any) -> dict[str, Any]:
    return {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "fake_tag": tag, **extra}


def ask(
    gw: Gateway, key: str, tag: str | None = None, headers: dict[str, str] | None = None, **extra: Any
) -> httpx.Response:
    # A new connection each time, so the kernel spreads requests over both workers.
    return httpx.post(
        gw.url + "/v1/chat/completions",
        json=body(tag or key, **extra),
        headers={"Authorization": f"Bearer {secret(key)}", **(headers or {})},
        timeout=60,
    )


def flood(gw: Gateway, key: str, clients: int) -> Load:
    """`clients` connections of one key, each asking again as soon as it is answered."""
    return Load(gw.url, lambda n: body(key), clients, {"Authorization": f"Bearer {secret(key)}"})


def stats(e: Engine) -> dict[str, Any]:
    return e.stats()


def reset(e: Engine) -> None:
    httpx.post(e.url + "/fake/reset", timeout=10)


def served_count(e: Engine) -> int:
    return len(stats(e)["served"])


def timed(gw: Gateway, key: str, count: int) -> list[float]:
    """Seconds for each of `count` requests sent one after another."""
    times = []
    for _ in range(count):
        start = time.monotonic()
        answer = ask(gw, key)
        assert answer.status_code == 200, answer.text
        times.append(time.monotonic() - start)
    return times


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def at_once(count: int, call: Any) -> list[Any]:
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(call, range(count)))
