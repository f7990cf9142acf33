"""Engine processes: started in a session of their own, recorded in the state dir, adopted again.

An engine outlives a killed agent on purpose: a restarted agent finds it through its record
(pid, the kernel's start time of that pid, the command line) and takes it back instead of
starting a second copy on the same port or dropping the requests it is serving. All three
must match /proc, so a recycled pid is never mistaken for our engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Record:
    key: str
    pid: int
    start_time: int  # /proc/PID/stat field 22, in clock ticks since boot
    argv: tuple[str, ...]
    fingerprint: str  # what the plan asked for; a different one means replace


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces; the fields after it are fixed.
    return text[text.rindex(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def is_running(pid: int, started: int | None = None) -> bool:
    """The pid is alive, not a zombie, and (when given) the same process that was started."""
    fields = _stat_fields(pid)
    if not fields or fields[0] in ("Z", "X"):
        return False
    return started is None or int(fields[19]) == started


def cmdline(pid: int) -> tuple[str, ...]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ()
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0")[:-1])


class EngineProcess:
    """One engine: a child of this agent, or one adopted from a record."""

    def __init__(self, pid: int, started: int | None, popen: subprocess.Popen[bytes] | None = None) -> None:
        self.pid = pid
        self.started = started
        self.popen = popen
        self.exit_code: int | None = None

    @classmethod
    def spawn(cls, argv: tuple[str, ...], env: dict[str, str], log: Path) -> EngineProcess:
        private_folder(log.parent)
        with os.fdopen(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as out:
            # O_APPEND, so the agent can cap the file by truncating it while the engine writes.
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                # A session of its own: Ctrl-C at the agent's terminal does not reach the
                # engine (the agent stops it in order), and a killed agent leaves it serving.
                start_new_session=True,
            )
        return cls(popen.pid, start_time(popen.pid), popen)

    def alive(self) -> bool:
        if self.popen is not None:
            code = self.popen.poll()
            if code is not None:
                self.exit_code = code
                return False
            return True
        return is_running(self.pid, self.started)

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            # The engine leads its own process group: its children (vLLM's workers) go too.
            os.killpg(self.pid, sig)

    def wait_gone(self, timeout: float) -> bool:
        """Whether it ended within `timeout` seconds. The kernel says when (a pidfd turns
        readable as the process ends): polling every 50 ms added 25 ms on average to every
        on-demand swap, which waits for the evicted engine to be gone before starting."""
        if not self.alive():
            return True
        try:
            ended = os.pidfd_open(self.pid)
        except OSError:  # an old kernel, or gone already: poll
            return self._poll_gone(timeout)
        try:
            select.select([ended], [], [], timeout)
        finally:
            os.close(ended)
        return self._poll_gone(0.5)  # our child is reaped by alive(); another's by init, soon

    def _poll_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                return True
            time.sleep(0.01)
        return not self.alive()


def record_path(state_dir: Path, key: str) -> Path:
    return state_dir / "replicas" / f"{_safe(key)}.json"


def log_path(state_dir: Path, key: str) -> Path:
    return state_dir / "logs" / f"{_safe(key)}.log"


def _safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in key)


def private_folder(folder: Path) -> None:
    """A folder of the agent's alone (0700), as its token and credential files are: an
    engine's log and record say what it runs and where its files are."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)


def save_record(state_dir: Path, record: Record) -> None:
    path = record_path(state_dir, record.key)
    private_folder(path.parent)
    tmp = path.with_suffix(".tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(json.dumps(asdict(record)))
    os.replace(tmp, path)


def drop_record(state_dir: Path, key: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        record_path(state_dir, key).unlink()


def load_records(state_dir: Path) -> dict[str, Record]:
    """Records whose process still runs as it was started; the others are deleted."""
    out: dict[str, Record] = {}
    for path in sorted((state_dir / "replicas").glob("*.json")):
        try:
            doc = json.loads(path.read_text())
            record = Record(doc["key"], doc["pid"], doc["start_time"], tuple(doc["argv"]), doc["fingerprint"])
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)
            continue
        if is_running(record.pid, record.start_time) and _runs(cmdline(record.pid), record.argv):
            out[record.key] = record
        else:
            path.unlink(missing_ok=True)
    return out


def _runs(running: tuple[str, ...], argv: tuple[str, ...]) -> bool:
    """The process runs this command line. Its arguments must match; the program may read
    differently, since a wrapper script that execs the engine (`#!/bin/sh` … exec) shows
    the interpreter's name in /proc where the agent recorded the script's."""
    args = argv[1:]
    return len(running) >= len(argv) and running[len(running) - len(args) :] == args


def cap_log(log: Path, limit: int) -> None:
    """Keep the log under `limit` bytes: the full file moves to .1 and the log starts again.

    Copy then truncate, because the engine holds the file open and cannot be told to reopen
    it; the engine writes with O_APPEND, so its next line lands at the new start.
    """
    try:
        if log.stat().st_size <= limit:
            return
        old = log.with_name(log.name + ".1")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        with log.open("rb") as src, os.fdopen(os.open(old, flags, 0o600), "wb") as dst:
            while block := src.read(1 << 20):
                dst.write(block)
        os.truncate(log, 0)
    except OSError:
        return


def log_tail(log: Path, lines: int = 5) -> str:
    try:
        with log.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())
