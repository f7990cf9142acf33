"""Waking a request that waits in another worker, at once, when a slot is granted to it.

A grant is made by whichever worker frees the slot, and the request it goes to may wait in
another: polling the store found it 10 to 25 ms later, so every hand-off across workers left
the slot idle that long (four slots kept full served 0.15 of what the same gateway served
with slots to spare). Each worker listens on a datagram socket in the directory the
instance's workers share, named for the prefix of its requests' ids; the worker that grants
sends the ids there. A worker gone, or an id of another instance (on Redis), finds no socket:
the send fails quietly, and polling, kept as the floor, finds the grant.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger("llmgw.gateway")


def prefix_of(id: str) -> str:
    """The part of a request's id that names its worker: `PID.RANDOM.` of `PID.RANDOM.N.TRY`."""
    pid, _, rest = id.partition(".")
    return f"{pid}.{rest.partition('.')[0]}."


class Wakeups:
    def __init__(self, directory: Path, prefix: str, woken: Callable[[list[str]], None]) -> None:
        self.directory = directory
        self.prefix = prefix
        self.woken = woken
        self.inbox: socket.socket | None = None
        self.outbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.outbox.setblocking(False)

    def _path(self, prefix: str) -> str:
        return str(self.directory / f"wake-{prefix}sock")

    def listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """Take this worker's ids from other workers on `loop`; quietly nothing if the
        socket cannot be made (a path too long, say): polling still finds every grant."""
        try:
            inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            inbox.bind(self._path(self.prefix))
            inbox.setblocking(False)
        except OSError as exc:
            log.warning("waiting requests are found by polling only: %s", exc)
            return
        self.inbox = inbox
        loop.add_reader(inbox.fileno(), self._read)

    def _read(self) -> None:
        assert self.inbox is not None
        while True:
            try:
                data = self.inbox.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            self.woken(data.decode("ascii", "replace").split())

    def send(self, ids: Iterable[str]) -> None:
        """Tell each other worker of this instance the ids granted to its requests."""
        by_worker: dict[str, list[str]] = {}
        for id in ids:
            prefix = prefix_of(id)
            if prefix != self.prefix:
                by_worker.setdefault(prefix, []).append(id)
        for prefix, group in by_worker.items():
            with contextlib.suppress(OSError):  # gone, or another instance's: it polls
                self.outbox.sendto("\n".join(group).encode("ascii"), self._path(prefix))

    def close(self) -> None:
        self.outbox.close()
        if self.inbox is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self.inbox.fileno())
            self.inbox.close()
            with contextlib.suppress(OSError):
                Path(self._path(self.prefix)).unlink()
