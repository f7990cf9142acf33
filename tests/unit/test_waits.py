"""An acquire whose caller leaves must stop waiting for its engine at once: the agent's
wait for a state change keeps a cancellation that lands as the state changes."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.node.runner import wait_at_most


def test_a_cancellation_that_lands_as_the_event_is_set_is_kept() -> None:
    async def main() -> None:
        event = asyncio.Event()
        waiting = asyncio.get_running_loop().create_task(wait_at_most(event, 30))
        await asyncio.sleep(0)  # it waits now
        event.set()  # a health check changed the state...
        waiting.cancel()  # ...as the caller's connection closed
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(main())


def test_it_returns_when_set_or_when_the_time_is_up() -> None:
    async def main() -> None:
        event = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, event.set)
        await wait_at_most(event, 30)
        assert event.is_set()
        await wait_at_most(asyncio.Event(), 0.01)  # nothing set: back after the time, no error

    asyncio.run(main())
