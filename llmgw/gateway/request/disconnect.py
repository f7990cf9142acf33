"""Knowing that a client has gone: told by the server's protocol, or by watching ASGI's
`receive` under another server, so a request waiting on an engine can be cancelled and an
abandoned generation stops costing GPU time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

Receive = Callable[[], Awaitable[dict[str, Any]]]
CLIENT_GONE = 499  # nginx's "client closed request": logged, never seen by a client
# Set in the request's scope by the server's protocol (gateway/server/worker.py) when it dropped a
# client that read nothing for this many seconds.
STALLED = "llmgw.stalled"


class ClientGone:
    """Put in each request's scope by the server's protocol (gateway/server/worker.py), which
    calls `notify` when the client's connection is lost before the answer is complete.

    Told by the protocol, rather than by a task per request waiting on ASGI's `receive`
    for `http.disconnect`: that task cost more than anything else the proxy does for a
    short answer, and nearly every client stays to the end.
    """

    __slots__ = ("gone", "listeners")

    def __init__(self) -> None:
        self.gone = False
        self.listeners: list[Callable[[], None]] = []

    def notify(self) -> None:
        self.gone = True
        for listener in self.listeners:
            listener()
        self.listeners.clear()


GONE = "llmgw.gone"


class Disconnect:
    """Cancels the request's task if the client leaves while it waits on the upstream."""

    __slots__ = ("task", "waiting", "gone", "watcher", "signal")

    def __init__(self, scope: dict[str, Any]) -> None:
        self.task = asyncio.current_task()
        self.waiting = False
        self.gone = False
        self.watcher: asyncio.Task[None] | None = None
        self.signal: ClientGone | None = scope.get(GONE)
        if self.signal is not None:
            if self.signal.gone:
                self.gone = True
            else:
                self.signal.listeners.append(self._left)
            return
        # Served by some other server than the gateway's worker: watch `receive` instead.
        receive: Receive | None = scope.get("llmgw.receive")
        if receive is not None:
            self.watcher = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._left()

    def _left(self) -> None:
        self.gone = True
        # Only while our own code awaits the upstream: cancelling the task anywhere else
        # (inside falcon's send, say) would surface as an error in the server's log.
        if self.waiting and self.task is not None:
            self.task.cancel()

    def absorb(self) -> bool:
        """After a CancelledError: True when it was ours, and the task may carry on."""
        if not self.gone or self.task is None:
            return False
        self.task.uncancel()
        return True

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()
        if self.signal is not None:
            self.signal.listeners.clear()


