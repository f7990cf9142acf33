"""FIFO: earliest arrival first, whoever sent it and whichever on-demand model is loaded. The
reference bench/fairness.py and the fairness tests compare the fair policy against."""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.gateway.schedule.policy import Ledger, Policy, Waiter


class Fifo(Policy):
    name = "fifo"
    summary = "first come, first served"
    # Rooms are the fair policy's: fifo grants in arrival order, even if that swaps at each one.
    uses_rooms = False

    def first(self, placed: Sequence[tuple[Waiter, str]], ledger: Ledger) -> tuple[Waiter, str]:
        return placed[0]


FIFO = Fifo()
