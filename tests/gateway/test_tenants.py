"""Named keys (keys.yaml): who may call, which models each key may use, and reloads."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import Engine, Gateway, gateway, key_digest, model, plan, profile, wait_until, write_plan

TEAM_A = "sk-team-a"
TEAM_B = "sk-team-b"
OLD = "sk-expired"
LATER = "sk-added-later"


def keys_yaml(*entries: str) -> str:
    return "# yaml-language-server: $schema=schema/keys.schema.json\nkeys:\n" + "".join(entries)


def entry(name: str, key: str, extra: str = "") -> str:
    return f"  - name: {name}\n    sha256: {key_digest(key)}\n{extra}"


BASE = keys_yaml(
    entry("team-a", TEAM_A, "    models: [default, llama-*]\n"),
    entry("team-b", TEAM_B),
    entry("old", OLD, "    expires: 2020-01-31\n"),
)


def replace(path: Path, text: str) -> None:
    """As a deploy does: written beside, then renamed over."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, engine_a: Engine) -> Iterator[tuple[Gateway, Path]]:
    tmp = tmp_path_factory.mktemp("tenants")
    path = tmp / "plan.json"
    write_plan(
        path,
        plan(
            [
                model("chat", [profile([engine_a.url], "chat")], aliases=["default"]),
                model("llama-8b", [profile([engine_a.url], "llama-8b")]),
                model("embed", [profile([engine_a.url], "embed")], task="embedding"),
            ]
        ),
    )
    keys = tmp / "keys.yaml"
    keys.write_text(BASE)
    with gateway(path, LLMGW_KEYS_FILE=str(keys)) as gw:
        yield gw, keys


def ask(gw: Gateway, key: str, model_name: str = "chat") -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": model_name, "messages": []},
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )


def test_a_named_key_is_served(served: tuple[Gateway, Path]) -> None:
    gw, _ = served
    answer = ask(gw, TEAM_B)
    assert answer.status_code == 200, answer.text


def test_an_unknown_key_is_401(served: tuple[Gateway, Path]) -> None:
    gw, _ = served
    answer = ask(gw, "sk-nobody")
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "invalid_api_key"


def test_an_expired_key_is_401_saying_when_it_expired(served: tuple[Gateway, Path]) -> None:
    gw, _ = served
    answer = ask(gw, OLD)
    assert answer.status_code == 401
    error = answer.json()["error"]
    assert error["code"] == "expired_api_key"
    assert "2020-01-31" in error["message"] and "'old'" in error["message"]


def test_models_by_alias_and_glob_are_allowed(served: tuple[Gateway, Path]) -> None:
    gw, _ = served
    assert ask(gw, TEAM_A, "chat").status_code == 200, "`default` is chat's alias: chat is allowed"
    assert ask(gw, TEAM_A, "llama-8b").status_code == 200, "llama-* matches llama-8b"


def test_a_model_the_key_may_not_use_is_403_naming_those_it_may(served: tuple[Gateway, Path]) -> None:
    gw, _ = served
    answer = httpx.post(
        gw.url + "/v1/embeddings",
        json={"model": "embed", "input": "x"},
        headers={"Authorization": f"Bearer {TEAM_A}"},
        timeout=10,
    )
    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert error["code"] == "model_not_allowed" and error["param"] == "model"
    assert "'chat'" in error["message"] and "'llama-8b'" in error["message"]
    assert "'embed'" in error["message"].split("may use", 1)[0], error["message"]


def test_models_lists_only_what_the_key_may_use(served: tuple[Gateway, Path]) -> None:
    gw, _ = served

    def listed(key: str) -> list[str]:
        answer = httpx.get(gw.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
        return [m["id"] for m in answer.json()["data"]]

    assert listed(TEAM_A) == ["chat", "llama-8b"]
    assert listed(TEAM_B) == ["chat", "llama-8b", "embed"]
    one = httpx.get(gw.url + "/v1/models/embed", headers={"Authorization": f"Bearer {TEAM_A}"}, timeout=10)
    assert one.status_code == 403


def _every_worker_answers(gw: Gateway, key: str, status: int) -> bool:
    # Fresh connections, so the kernel spreads them over the workers.
    return all(ask(gw, key).status_code == status for _ in range(12))


def test_a_replaced_keys_file_is_read_by_every_worker(served: tuple[Gateway, Path]) -> None:
    gw, keys = served
    try:
        replace(keys, BASE + entry("later", LATER))
        wait_until(lambda: _every_worker_answers(gw, LATER, 200), 10, "the new key to work everywhere")
    finally:
        replace(keys, BASE)
    wait_until(lambda: _every_worker_answers(gw, LATER, 401), 10, "the removed key to be refused")


def test_a_bad_keys_file_is_refused_and_the_old_keys_keep_working(served: tuple[Gateway, Path]) -> None:
    gw, keys = served
    try:
        replace(keys, BASE + "  - name: broken\n    sha256: not-a-digest\n")
        wait_until(lambda: "refused the keys file" in gw.log(), 10, "the bad file to be refused")
        assert _every_worker_answers(gw, TEAM_B, 200)
        refused = gw.every_worker(lambda r: r["keys"]["result"] == "refused", 10, "the refused keys")
        assert all("sha256" in r["keys"]["reason"] for r in refused.values())
    finally:
        replace(keys, BASE)


def alias_bomb(levels: int = 9) -> str:
    """Nine levels of nine aliases each: a few hundred bytes that expand to 9**9 strings."""
    lines = ["bomb:", "  - &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  - &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]" for n in range(1, levels)]
    return "\n".join(lines) + "\n"


UNREADABLE = {
    # Read with a loader that followed every alias, each worker grew past 2 GB and answered
    # nothing, and the workers gunicorn started in their place read it and hung too.
    "an alias bomb": (BASE + alias_bomb()).encode(),
    # A date YAML reads as one but no calendar has: ruamel raised ValueError past the reader.
    "an impossible date": (BASE + entry("later", LATER, "    expires: 2027-02-29\n")).encode(),
    "a byte that is not UTF-8": BASE.encode() + "# caf\u00e9\n".encode("latin-1"),
}


@pytest.mark.parametrize("fault", sorted(UNREADABLE))
def test_an_unreadable_keys_file_is_refused_in_running_and_replacement_workers(
    served: tuple[Gateway, Path], fault: str
) -> None:
    gw, keys = served
    try:
        tmp = keys.with_name(".keys.yaml.tmp")
        tmp.write_bytes(UNREADABLE[fault])
        os.replace(tmp, keys)
        refused = gw.every_worker(
            lambda r: r["keys"]["result"] == "refused", 10, f"keys with {fault} refused"
        )
        assert all("LLMGW_KEYS_FILE" in r["keys"]["reason"] for r in refused.values())
        # A worker that dies while the file is bad is replaced by one that starts on the last
        # good keys: before, it exited with code 3 and gunicorn shut the whole gateway down.
        victim = next(iter(gw.worker_pids()))
        os.kill(victim, signal.SIGKILL)
        wait_until(
            lambda: victim not in gw.worker_pids() and len(gw.worker_pids()) >= gw.workers,
            20,
            "gunicorn to replace the killed worker",
        )
        gw.every_worker(
            lambda r: r["keys"]["result"] == "refused", 15, "the replacement refusing the file too"
        )
        assert _every_worker_answers(gw, TEAM_B, 200), "the last good keys keep working everywhere"
        assert gw.proc.poll() is None, "the gateway is still running"
    finally:
        replace(keys, BASE)
        gw.every_worker(lambda r: r["keys"]["result"] == "loaded", 10, "the good keys back")


def test_keys_reloaded_under_load_fail_no_request(served: tuple[Gateway, Path]) -> None:
    gw, keys = served
    stopping = threading.Event()
    failures: list[str] = []
    count = [0]

    def hammer() -> None:
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {TEAM_B}"}) as client:
            while not stopping.is_set():
                body: dict[str, Any] = {"model": "chat", "messages": [], "stream": count[0] % 2 == 0}
                answer = client.post(gw.url + "/v1/chat/completions", json=body)
                count[0] += 1
                if answer.status_code != 200:
                    failures.append(f"{answer.status_code} {answer.text}")

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for i in range(10):
            replace(keys, BASE + entry(f"extra-{i}", f"sk-extra-{i}"))
            threading.Event().wait(0.2)
    finally:
        stopping.set()
        for t in threads:
            t.join()
        replace(keys, BASE)
    assert count[0] > 20
    assert not failures, f"{len(failures)} of {count[0]} requests failed during reloads: {failures[:3]}"


def test_the_access_log_names_the_key_never_the_key_itself(served: tuple[Gateway, Path]) -> None:
    gw, _ = served
    assert ask(gw, TEAM_B).status_code == 200
    wait_until(
        lambda: any(line.get("key") == "team-b" for line in gw.access_lines()),
        10,
        "an access log line naming team-b",
    )
    assert TEAM_B not in gw.log()


def test_the_plain_digest_file_is_reloaded_too(tmp_path: Path, engine_a: Engine) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, plan([model("chat", [profile([engine_a.url], "chat")])]))
    keys = tmp_path / "keys.txt"
    keys.write_text(f"{key_digest(TEAM_A)}\n")
    with gateway(path, LLMGW_API_KEYS_FILE=str(keys)) as gw:
        assert ask(gw, TEAM_A).status_code == 200
        assert ask(gw, LATER).status_code == 401
        replace(keys, f"{key_digest(TEAM_A)}\n{key_digest(LATER)}\n")
        wait_until(lambda: _every_worker_answers(gw, LATER, 200), 10, "the added digest to work everywhere")
