"""A real redis-server for the shared-limits tests and the bench: on loopback, on a port the
OS picks, keeping nothing on disk, killed by whoever started it."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from harness import free_port, stop, wait_until


@dataclass
class RedisServer:
    port: int
    directory: Path
    password: str | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it (again, on the same port: a restarted Redis, empty)."""
        argv = [
            _binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(self.directory),
        ]  # fmt: skip
        if self.password:
            argv += ["--requirepass", self.password]
        with open(self.directory / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        conn = redis.Redis.from_url(self.url, socket_timeout=1)
        try:
            wait_until(lambda: self._up(conn), 10, f"redis-server on port {self.port}")
        finally:
            conn.close()

    def _up(self, conn: redis.Redis) -> bool:
        assert self.proc is not None and self.proc.poll() is None, (self.directory / "redis.log").read_text()
        try:
            return bool(conn.ping())
        except redis.ConnectionError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None


def _binary() -> str:
    # /usr/bin is Debian's place for it, even when PATH leaves it out.
    found = shutil.which("redis-server") or shutil.which("redis-server", path="/usr/bin")
    if found is None:
        pytest.fail("redis-server is not installed: `apt-get install redis-server` (.ci/run does)")
    return found


@contextlib.contextmanager
def redis_server(directory: Path, password: str | None = None) -> Iterator[RedisServer]:
    server = RedisServer(free_port(), directory, password)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class FakeResp:
    """A server that speaks Redis's protocol (RESP) on loopback and answers each command as
    it is told: what a proxy in the way, or something that is not Redis, might say."""

    def __init__(self, replies: dict[str, bytes]) -> None:
        # Command name (upper case) → the raw reply; any other command is answered +OK.
        self.replies = replies
        self.seen: list[str] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        with conn, reader:
            while True:
                header = reader.readline()
                if not header.startswith(b"*"):
                    return
                args = []
                for _ in range(int(header[1:])):
                    size = int(reader.readline()[1:])
                    args.append(reader.read(size + 2)[:-2].decode())
                name = args[0].upper()
                self.seen.append(name)
                try:
                    conn.sendall(self.replies.get(name, b"+OK\r\n"))
                except OSError:
                    return

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def fake_resp(replies: dict[str, bytes]) -> Iterator[FakeResp]:
    server = FakeResp(replies)
    try:
        yield server
    finally:
        server.close()
