"""gunicorn settings `llmgw serve` loads with `--config python:llmgw.gateway.server.gunicorn_conf`."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

# Set by `llmgw serve` to the metrics directory it made, so only that one is removed.
MADE_METRICS_DIR = "LLMGW_MADE_METRICS_DIR"

# The files prometheus_client keeps per process: counter_123.db, gauge_liveall_123.db, …
_METRICS_FILE = re.compile(r"^(counter|gauge|histogram|summary)_.*\.db$")
# The dashboard's readings of those files (rates.FILE_NAME; not imported, since that would
# load prometheus_client into gunicorn's master): last run's totals are no baseline for this one's.
USAGE_READINGS = "llmgw-usage-readings.json"
# state/workers.DIRECTORY, not imported: llmgw.gateway's package loads the whole app.
WORKERS = "llmgw-workers"


def on_starting(server: Any) -> None:
    # A directory the operator keeps across restarts still holds the last run's files,
    # and /metrics would add those dead pids' counts to this run's.
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory or not os.path.isdir(directory):
        return
    for path in Path(directory).iterdir():
        if _METRICS_FILE.match(path.name) or path.name == USAGE_READINGS:
            path.unlink(missing_ok=True)
    # Last run's workers' words for /readyz: a pid reused since would speak for the dead.
    shutil.rmtree(Path(directory) / WORKERS, ignore_errors=True)


def child_exit(server: Any, worker: Any) -> None:
    # A dead worker's live gauges (replica health, plan digest) must leave /metrics with it,
    # and its word /readyz (state/workers.py).
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]  # unannotated upstream
        (Path(directory) / WORKERS / f"{worker.pid}.json").unlink(missing_ok=True)


def on_exit(server: Any) -> None:
    # A fresh directory per start would otherwise pile up in /tmp, one per restart.
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory and os.environ.get(MADE_METRICS_DIR) == directory:
        shutil.rmtree(directory, ignore_errors=True)


# gunicorn 24+ opens a control socket at one fixed path per user; two gateways on one
# host (or a test beside a running one) would fight over it, and llmgw never uses it.
control_socket_disable = True


def post_fork(server: Any, worker: Any) -> None:
    # A master killed with SIGKILL (the OOM killer, `kill -9`, a container's hard stop) left
    # both workers answering on the port with parent 1, unsupervised, and every restart of
    # the service failed on "Connection in use": the kernel now ends a worker with its master.
    import signal

    from llmgw.lifetime import die_with_parent

    die_with_parent(signal.SIGKILL, parent=server.pid)
