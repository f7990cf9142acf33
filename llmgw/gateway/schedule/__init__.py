"""Fair scheduling: slots per replica, a line per model, shares and priorities per key.

policy.py    who goes next, a pure function of what waits, what is free and each key's service,
             ordered by a `Policy`: fair.py (the default) or fifo.py, by name in policies.py
store.py     the shared state behind one interface: one instance's workers on SQLite
store_redis.py  the same across every instance, on Redis (LLMGW_REDIS_URL)
queue.py     a request's place in line (`Ticket.take`, `Ticket.give_back`), the 503 and 429
"""

from __future__ import annotations

from llmgw.gateway.schedule.policy import BANDS
from llmgw.gateway.schedule.queue import Scheduler, Ticket, band_of
from llmgw.gateway.schedule.store import LocalStore, Store

__all__ = ["BANDS", "LocalStore", "Scheduler", "Store", "Ticket", "band_of"]
