"""gunicorn settings `llmgw serve` loads with `--config python:llmgw.gateway.gunicorn_conf`."""

from __future__ import annotations

import os
from typing import Any


def child_exit(server: Any, worker: Any) -> None:
    # A dead worker's live gauges (replica health, plan digest) must leave /metrics with it.
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)


# gunicorn 24+ opens a control socket at one fixed path per user; two gateways on one
# host (or a test beside a running one) would fight over it, and llmgw never uses it.
control_socket_disable = True
