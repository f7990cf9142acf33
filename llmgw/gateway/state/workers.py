"""What every worker of this gateway says of itself, so that any one of them can answer
/readyz for all: which plan each serves, its last reload, its keys and its limits.

Workers reload on their own, so a deploy has taken when every worker says so. Asking
/readyz again and again until each worker had answered once did not tell: the kernel hands
a new connection to whichever worker wakes first, and on a quiet machine that was the same
worker nearly every time (87 of 100 connections in one run, and for seconds on end all of
them), so the others went unheard and a deploy looked stuck. Each worker now writes its
own word to a file in the directory the workers share, when it changes, and /readyz reads
them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

DIRECTORY = "llmgw-workers"


class Workers:
    def __init__(self, shared: Path, describe: Callable[[], dict[str, Any]]) -> None:
        self.directory = shared / DIRECTORY
        self.describe = describe
        self.pid = os.getpid()
        self.written: dict[str, Any] | None = None

    def publish(self) -> dict[str, Any]:
        """This worker's word now, written for the others when it changed."""
        doc = self.describe()
        if doc != self.written:
            with contextlib.suppress(OSError):  # a full disk costs the others' view, not the answer
                self.directory.mkdir(mode=0o700, exist_ok=True)
                path = self.directory / f"{self.pid}.json"
                tmp = path.with_name(f".{self.pid}.json.tmp")
                tmp.write_text(json.dumps(doc), encoding="utf-8")
                os.replace(tmp, path)
                self.written = doc
        return doc

    async def watch(self, interval: float) -> None:
        """Keep this worker's word current: a reload, a refused keys file, Redis lost."""
        while True:
            self.publish()
            await asyncio.sleep(interval)

    def everyone(self) -> dict[str, dict[str, Any]]:
        """Each live worker's last word, by pid; this worker's fresh."""
        out: dict[str, dict[str, Any]] = {}
        with contextlib.suppress(OSError):
            for path in self.directory.glob("*.json"):
                pid = int(path.stem) if path.stem.isdigit() else 0
                if pid and pid != self.pid and alive(pid):
                    with contextlib.suppress(OSError, ValueError):
                        out[str(pid)] = json.loads(path.read_text(encoding="utf-8"))
        out[str(self.pid)] = self.publish()
        return dict(sorted(out.items()))


def alive(pid: int) -> bool:
    """Whether process `pid` is still there (on this machine)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive, just not ours to signal
    return True
