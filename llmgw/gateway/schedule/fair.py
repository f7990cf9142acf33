"""Fair (the default): the highest priority band with a request that can be placed goes first;
within a band, the key that has had the least service for its share (start-time fair queueing:
each grant adds the request's cost divided by the key's share to the key's virtual service);
first come, first served within one key. A key that starts waiting after being idle starts at
the band's current virtual time (`Ledger.joined`), so idling banks no credit: a key quiet for an
hour does not then get an hour's worth of slots ahead of everyone.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.gateway.schedule.policy import Ledger, Policy, Waiter


class Fair(Policy):
    name = "fair"
    summary = "shares and priorities per key, the default"
    uses_rooms = True

    def first(self, placed: Sequence[tuple[Waiter, str]], ledger: Ledger) -> tuple[Waiter, str]:
        service = ledger.service
        return min(placed, key=lambda p: (-p[0].band, service.get(p[0].key, 0.0), p[0].since, p[0].id))


FAIR = Fair()
