"""Fair scheduling when a model is busy (issue 34): the gateway sends a replica no more
requests than its slots (`--parallel N`), holds the rest in a queue per key, and chooses the
next by priority, then by share, so one key's batch cannot starve another key's chat.

Each test starts the real gateway (two workers) before a stand-in engine with slots
(fake_engine.py's `--parallel N --service-time S`), which counts the most requests it ever
had at once and labels the order it began work on them by each request's `fake_tag`.
Bounds are in service times, and generous: this runs beside other test runs on two cores.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from busy import (
    S,
    ask,
    at_once,
    body,
    flood,
    metric,
    p99,
    reset,
    secret,
    served,
    served_count,
    slots,
    stats,
    timed,
    write_files,
)
from harness import Engine, Gateway, gateway, wait_until
from redis_server import redis_server


def test_two_workers_never_send_the_engine_more_than_its_slots(tmp_path: Path) -> None:
    with slots(3) as e, served(tmp_path, e, 3) as gw:
        answers = at_once(40, lambda i: ask(gw, "batch", f"b{i}"))
        assert [a.status_code for a in answers] == [200] * 40, [
            a.text for a in answers if a.status_code != 200
        ][:2]
        seen = stats(e)
        assert seen["max_in_flight"] <= 3, (
            f"the engine had {seen['max_in_flight']} requests at once; --parallel 3"
        )
        assert seen["max_in_flight"] == 3, "the gateway held requests back it had slots for"
        waited = [a.headers.get("x-llmgw-queue-wait-ms") for a in answers]
        assert any(w is not None and float(w) > 0 for w in waited), "no answer said how long it waited"


def quiet_beside_flood(gw: Gateway, e: Engine, count: int) -> list[float]:
    with flood(gw, "flood", 32) as load:
        start = served_count(e)
        wait_until(lambda: served_count(e) >= start + 20, 30, "the flood to fill the queue")
        times = timed(gw, "quiet", count)
    assert not load.failures, load.failures[:3]
    return times


def test_a_quiet_key_beside_a_flood_waits_a_few_service_times_not_for_the_flood(tmp_path: Path) -> None:
    with slots(2) as e, served(tmp_path, e, 2) as gw:
        alone = timed(gw, "quiet", 15)
        beside = quiet_beside_flood(gw, e, 20)
    assert p99(beside) <= p99(alone) + 5 * S, (
        f"the quiet key's p99 was {p99(beside):.3f} s beside a flood of 32, {p99(alone):.3f} s alone: "
        f"more than 5 service times ({S} s) worse"
    )


def test_first_come_order_makes_the_quiet_key_wait_behind_the_flood(tmp_path: Path) -> None:
    """The reference: with LLMGW_SCHEDULER=fifo the same measure is far worse, so the test
    above can tell fair from not."""
    with slots(2) as e, served(tmp_path, e, 2, LLMGW_SCHEDULER="fifo") as gw:
        alone = timed(gw, "quiet", 10)
        beside = quiet_beside_flood(gw, e, 6)
        assert stats(e)["max_in_flight"] <= 2, "fifo still holds the replica to its slots"
    worse = statistics.median(beside) - statistics.median(alone)
    assert worse >= 8 * S, (
        f"first come, first served: the quiet key waited only {worse:.3f} s more behind 32 "
        f"(alone {statistics.median(alone):.3f} s, beside {statistics.median(beside):.3f} s)"
    )


def completions(e: Engine, keys: list[str], gw: Gateway, clients: list[int], seconds: float) -> Counter[str]:
    """How many requests of each key the engine began in `seconds` of all flooding at once."""
    floods = [flood(gw, key, n) for key, n in zip(keys, clients, strict=True)]
    with contextlib.ExitStack() as stack:
        for load in floods:
            stack.enter_context(load)
        time.sleep(1.5)  # every key's queue full
        before = Counter(stats(e)["served"])
        time.sleep(seconds)
        after = Counter(stats(e)["served"])
    for load in floods:
        assert not load.failures, load.failures[:3]
    return Counter({key: after[key] - before[key] for key in keys})


def test_shares_1_and_3_split_completions_about_1_to_3(tmp_path: Path) -> None:
    with slots(2) as e, served(tmp_path, e, 2) as gw:
        done = completions(e, ["one", "three"], gw, [16, 16], 4)
    ratio = done["three"] / max(1, done["one"])
    assert 2.0 <= ratio <= 4.5, (
        f"share 3 to share 1 completed {done['three']} to {done['one']}: not about 3:1"
    )


def test_equal_shares_split_evenly_however_many_connections_each_opens(tmp_path: Path) -> None:
    with slots(2) as e, served(tmp_path, e, 2) as gw:
        done = completions(e, ["few", "many"], gw, [4, 24], 4)
    ratio = done["many"] / max(1, done["few"])
    assert 0.67 <= ratio <= 1.5, (
        f"24 connections to 4 of equal share completed {done['many']} to {done['few']}"
    )


BATCH = 32
BATCH_S = 4 * S  # each of the batch's service times: 32 sent at once arrive before most are done


def batch_waiting_now(gw: Gateway, e: Engine) -> int:
    """How many of the batch wait in the gateway now; 0 until every one has reached it (begun
    by the engine or counted waiting). The engine is read first: a request that moves on
    between the two reads is then counted nowhere, never twice."""
    begun = stats(e)["served"].count("batch")
    waiting = int(metric(gw, "llmgw_queue_waiting", model="chat", key="batch") or 0)
    return waiting if begun + waiting >= BATCH else 0


@contextlib.contextmanager
def batch_waiting(gw: Gateway, e: Engine) -> Iterator[list[httpx.Response]]:
    """BATCH requests of the `batch` key sent at once and held by the gateway, a slot freeing
    every BATCH_S; the context begins once all have reached the gateway with at least half
    still waiting (on a loaded machine they trickle in), and ends when all are answered."""
    answers: list[httpx.Response] = []
    reset(e)
    pool = ThreadPoolExecutor(BATCH)
    futures = [pool.submit(ask, gw, "batch", "batch", fake_service=BATCH_S) for _ in range(BATCH)]
    try:
        waiting = wait_until(lambda: batch_waiting_now(gw, e), 30, "the whole batch to reach the gateway")
        assert waiting >= BATCH // 2, f"only {waiting} of the batch still waited once all had arrived"
        yield answers
    finally:
        answers.extend(f.result() for f in futures)
        pool.shutdown()
    assert [a.status_code for a in answers] == [200] * BATCH


def after(order: list[str], tag: str) -> int:
    """How many of the batch the engine began after `tag`."""
    return order[order.index(tag) :].count("batch")


def test_a_high_key_waits_about_one_service_time_behind_a_normal_flood(tmp_path: Path) -> None:
    with slots(2) as e, served(tmp_path, e, 2) as gw:
        with batch_waiting(gw, e):
            start = time.monotonic()
            answer = ask(gw, "high")
            took = time.monotonic() - start
            assert answer.status_code == 200, answer.text
        order = stats(e)["served"]
    assert after(order, "high") >= 10, f"the high key's request was begun after most of the batch: {order}"
    # One of the batch's service times for a slot to free, then its own.
    assert took <= BATCH_S + 4 * S + 0.3, f"the high key's request took {took:.3f} s behind a normal batch"


def test_a_request_that_lowers_itself_to_low_waits_behind_the_flood(tmp_path: Path) -> None:
    with slots(2) as e, served(tmp_path, e, 2) as gw:
        with batch_waiting(gw, e):
            answer = ask(gw, "high", "lowered", {"x-llmgw-priority": "low"})
            assert answer.status_code == 200, answer.text
        order = stats(e)["served"]
    assert after(order, "lowered") == 0, (
        f"a request marked low was begun before the normal batch ended: {order}"
    )


def test_a_priority_header_cannot_raise_a_request_above_its_key(tmp_path: Path) -> None:
    with slots(2) as e, served(tmp_path, e, 2) as gw:
        with batch_waiting(gw, e):
            answer = ask(gw, "batch", "raised", {"x-llmgw-priority": "high"})
            assert answer.status_code == 200, answer.text
        order = stats(e)["served"]
    assert after(order, "raised") == 0, (
        f"a normal key's request marked high overtook its own key's queue: {order}"
    )


def test_a_request_that_waits_too_long_is_a_503_with_retry_after_and_a_sentence(tmp_path: Path) -> None:
    with slots(1) as e, served(tmp_path, e, 1, LLMGW_QUEUE_WAIT="0.5") as gw:
        with ThreadPoolExecutor(1) as pool:
            holder = pool.submit(ask, gw, "batch", "holder", fake_service=3)
            wait_until(lambda: stats(e)["in_flight"] == 1, 10, "the long request to take the one slot")
            start = time.monotonic()
            answer = ask(gw, "quiet")
            took = time.monotonic() - start
            assert holder.result().status_code == 200
        begun = stats(e)["served"]  # while the engine still runs
    assert answer.status_code == 503, answer.text
    assert answer.headers.get("retry-after", "").isdigit(), answer.headers
    error = answer.json()["error"]
    assert error["code"] == "queue_timeout"
    assert "chat" in error["message"] and "busy" in error["message"], error["message"]
    assert 0.4 <= took <= 2.5, f"the 503 came after {took:.2f} s; LLMGW_QUEUE_WAIT is 0.5"
    assert "quiet" not in begun, "the request that timed out was sent to the engine anyway"


def test_a_key_past_its_queue_is_429_at_once_while_other_keys_still_queue(tmp_path: Path) -> None:
    """Also security issue 35, item 4: no key can take the whole queue."""
    env = {"LLMGW_QUEUE_PER_KEY": "3", "LLMGW_QUEUE_WAIT": "30"}
    with slots(1) as e, served(tmp_path, e, 1, **env) as gw, ThreadPoolExecutor(8) as pool:
        holder = pool.submit(ask, gw, "flood", "holder", fake_service=2)
        wait_until(lambda: stats(e)["in_flight"] == 1, 10, "the long request to take the one slot")
        queued = [pool.submit(ask, gw, "flood") for _ in range(3)]
        wait_until(
            lambda: metric(gw, "llmgw_queue_waiting", model="chat", key="flood") == 3, 10, "the three to wait"
        )
        start = time.monotonic()
        refused = ask(gw, "flood", "refused")
        took = time.monotonic() - start
        other = pool.submit(ask, gw, "quiet")
        answers = [holder.result(), *(q.result() for q in queued), other.result()]
        begun = stats(e)["served"]  # while the engine still runs
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "queue_full"
    assert "3" in error["message"] and "LLMGW_QUEUE_PER_KEY" in error["message"], error["message"]
    assert took < 1.0, f"the 429 took {took:.2f} s: a full queue is refused at once"
    assert [a.status_code for a in answers] == [200] * 5, (
        "the queued and the other key's request were answered"
    )
    assert "refused" not in begun, "the refused request was sent to the engine anyway"


def test_a_client_that_leaves_while_waiting_takes_no_slot(tmp_path: Path) -> None:
    with slots(2) as e, served(tmp_path, e, 2) as gw:
        with flood(gw, "flood", 24) as load:
            wait_until(lambda: served_count(e) >= 10, 30, "the flood to fill the queue")
            host, port = gw.url.removeprefix("http://").split(":")
            data = httpx.Request("POST", "http://x/", json=body("leaver")).read()
            with socket.create_connection((host, int(port))) as client:
                client.sendall(
                    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                    + f"authorization: Bearer {secret('flood')}\r\n".encode()
                    + f"content-length: {len(data)}\r\n\r\n".encode()
                    + data
                )
                time.sleep(0.3)  # behind its own key's two dozen: it waits
        assert not load.failures, load.failures[:3]
        wait_until(lambda: stats(e)["in_flight"] == 0, 10, "the flood to drain")
        time.sleep(0.5)
        assert "leaver" not in stats(e)["served"], "a request whose client left was sent to the engine"
        reset(e)
        answers = at_once(6, lambda i: ask(gw, "quiet", fake_service=0.3))
        assert all(a.status_code == 200 for a in answers)
        assert stats(e)["max_in_flight"] == 2, "a slot stayed with the client that left"


def worker_holding_a_slot(gw: Gateway, results: list[httpx.Response]) -> tuple[int, threading.Thread]:
    """Send a long request on a connection whose worker we know; its pid."""
    client = httpx.Client(timeout=60, limits=httpx.Limits(max_connections=1))
    pid = int(client.get(gw.url + "/readyz").json()["pid"])

    def long() -> None:
        with contextlib.suppress(httpx.HTTPError):
            results.append(
                client.post(
                    gw.url + "/v1/chat/completions",
                    json=body("doomed", fake_service=30),
                    headers={"Authorization": f"Bearer {secret('batch')}"},
                )
            )
        client.close()

    thread = threading.Thread(target=long, daemon=True)
    thread.start()
    return pid, thread


def test_slots_held_by_a_worker_killed_with_sigkill_come_back(tmp_path: Path) -> None:
    # A slot that never came back makes requests wait: 3 s of it is a 503, not a hang.
    with slots(2, service_s=0.2) as e, served(tmp_path, e, 2, LLMGW_QUEUE_WAIT="3") as gw:
        results: list[httpx.Response] = []
        held = [worker_holding_a_slot(gw, results) for _ in range(2)]
        wait_until(lambda: stats(e)["in_flight"] == 2, 10, "two long requests to hold both slots")
        for pid in {pid for pid, _ in held}:
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        for _, thread in held:
            thread.join(10)

        def full_parallelism() -> bool:
            reset(e)
            answers = at_once(4, lambda i: ask(gw, "quiet"))
            return all(a.status_code == 200 for a in answers) and stats(e)["max_in_flight"] == 2

        wait_until(full_parallelism, 30, "requests to be served two at a time again")
        took = time.monotonic() - killed
    assert took <= 20, f"the dead worker's slots came back only after {took:.1f} s"


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


def test_two_instances_sharing_redis_never_exceed_one_engines_slots(tmp_path: Path, redis_url: str) -> None:
    with slots(2) as e:
        env = {**write_files(tmp_path, [e.url], 2), "LLMGW_REDIS_URL": redis_url}
        with gateway(tmp_path / "plan.json", **env) as one, gateway(tmp_path / "plan.json", **env) as two:
            answers = at_once(40, lambda i: ask((one, two)[i % 2], "batch", f"b{i}"))
        assert [a.status_code for a in answers] == [200] * 40, [
            a.text for a in answers if a.status_code != 200
        ][:2]
        seen = stats(e)
        assert seen["max_in_flight"] <= 2, f"two instances sent {seen['max_in_flight']} at once; --parallel 2"
        assert seen["max_in_flight"] == 2, "the instances held back requests there were slots for"
