"""A model's source → its first bytes, in order: enough for the GGUF header, never the weights.

    local path           the file, opened; its size from the disk
    https://…            HTTP Range requests, each twice the last (1, 2, 4 … MiB), so a 6 MB
                         header costs three requests and at most twice the bytes it needs
    hf://org/repo/file   the same, from {HF_ENDPOINT or https://huggingface.co}/org/repo/resolve/main/file,
                         with HF_TOKEN when it is set

A server that ignores Range answers 200 with the whole file: that body is read as a stream
and closed once the header is in, so a 40 GB file still costs only what was read.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from llmgw.compiler.gguf_header import Stream
from llmgw.errors import InspectError
from llmgw.hub import PREFIX, auth_headers, hub_source

FIRST_RANGE = 1 << 20
LARGEST_RANGE = 16 << 20
# A header is a few MB: past this many seconds in all, the server is trickling, and lint or a
# person at a terminal should hear so rather than wait. Each read also has httpx's 30 s timeout.
DEFAULT_FETCH_DEADLINE = 60.0
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


@dataclass
class Opened:
    stream: Stream
    size: int | None  # the whole file's size, when the disk or server says it
    where: str  # how sentences name it: the source as written


@contextmanager
def open_source(text: str, base_dir: Path | None = None) -> Iterator[Opened]:
    """`base_dir` resolves a relative path, as a model file's own folder does for its source."""
    if text.startswith(PREFIX):
        url, where = hub_url(text), text
    elif text.startswith(("https://", "http://")):
        url, where = text, text
    else:
        with _open_file(text, base_dir) as opened:
            yield opened
        return
    with httpx.Client(follow_redirects=True, timeout=httpx.Timeout(30.0)) as client:
        ranges = _Ranges(client, url, auth_headers(url), where)
        try:
            ranges.start()
            yield Opened(ranges, ranges.size, where)
        finally:
            ranges.close()


def hub_url(text: str) -> str:
    hub = hub_source(text)
    assert hub is not None
    if hub.filename is None:
        raise InspectError(
            f"{text} names a repository, not a file: inspect reads one GGUF file. Add the file's "
            f"name, as in {hub.repository if hub.repo_id else 'hf://org/repo'}/model-Q4_K_M.gguf "
            "(the hub's file list shows the names)."
        )
    return hub.url()


@contextmanager
def _open_file(text: str, base_dir: Path | None) -> Iterator[Opened]:
    path = Path(text)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if path.is_dir():
        raise InspectError(f"{text} is a directory; give the .gguf file inside it.")
    try:
        handle: IO[bytes] = path.open("rb")
    except FileNotFoundError:
        raise InspectError(f"{text} does not exist (looked for {path.resolve()}); check the path.") from None
    except OSError as exc:
        raise InspectError(f"cannot read {text}: {exc.strerror or exc}.") from None
    with handle:
        yield Opened(handle, os.fstat(handle.fileno()).st_size, text)


class _Ranges:
    """Reads forward through a remote file, one Range request at a time."""

    def __init__(self, client: httpx.Client, url: str, headers: dict[str, str], where: str) -> None:
        self.client = client
        self.url = url
        self.headers = {**headers, "Accept-Encoding": "identity"}  # offsets are the file's own bytes
        self.where = where
        self.size: int | None = None
        self.offset = 0  # the next byte a request asks for
        self.step = FIRST_RANGE
        self.ranged = True
        self.response: httpx.Response | None = None
        self.chunks: Iterator[bytes] = iter(())
        self.deadline = _fetch_deadline()
        self.started = time.monotonic()

    def start(self) -> None:
        self._request()

    def read(self, n: int) -> bytes:
        while True:
            if time.monotonic() - self.started > self.deadline:
                raise InspectError(
                    f"{self.where} sent {self.offset} bytes of its header in {self.deadline:g} s and "
                    "was still sending: the server is too slow. Try again later, or raise "
                    "LLMGW_FETCH_DEADLINE (seconds)."
                )
            try:
                chunk = next(self.chunks, b"")
            except httpx.HTTPError as exc:
                # RemoteProtocolError, ReadError, ReadTimeout: the body stopped part way.
                raise InspectError(
                    f"{self.where} stopped sending {self.offset} bytes in ({type(exc).__name__}: "
                    f"{exc}): the connection was cut short. Try again; if it keeps happening, check "
                    "this machine's network or the server."
                ) from None
            if chunk:
                self.offset += len(chunk)
                return chunk
            if not self.ranged or (self.size is not None and self.offset >= self.size):
                return b""
            self._request()
            if self.response is None:
                return b""

    def close(self) -> None:
        # Closed, not drained: for a server that ignored Range, draining would fetch the weights.
        if self.response is not None:
            self.response.close()
            self.response = None
        self.chunks = iter(())

    def _request(self) -> None:
        self.close()
        end = self.offset + self.step - 1
        self.step = min(self.step * 2, LARGEST_RANGE)
        headers = {**self.headers, "Range": f"bytes={self.offset}-{end}"}
        try:
            request = self.client.build_request("GET", self.url, headers=headers)
            response = self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise InspectError(
                f"cannot reach {self.where} ({type(exc).__name__}: {exc}); check the address, or "
                "HF_ENDPOINT for an hf:// source, and this machine's network."
            ) from None
        if response.status_code == 416:  # asked past the end: the file is shorter than thought
            response.close()
            return
        self.response = response
        if response.status_code not in (200, 206):
            response.close()
            raise InspectError(_refusal(response.status_code, self.where))
        if response.status_code == 200:
            if self.offset:
                # Ranges honoured, then one ignored: reading on from byte 0 would repeat the header.
                raise InspectError(
                    f"{self.where}: the server stopped honouring Range requests part way; try again."
                )
            self.ranged = False
            length = response.headers.get("Content-Length")
            self.size = int(length) if length and length.isdigit() else None
        else:
            match = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
            if match and match.group(3) != "*":
                self.size = int(match.group(3))
        self.chunks = response.iter_raw()


def _fetch_deadline() -> float:
    text = os.environ.get("LLMGW_FETCH_DEADLINE", "")
    if not text:
        return DEFAULT_FETCH_DEADLINE
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise InspectError(
            f"LLMGW_FETCH_DEADLINE is {text!r}; give the seconds a remote header may take, e.g. 60, "
            "or unset it for the default."
        )
    return seconds


def _refusal(status: int, where: str) -> str:
    if status in (401, 403):
        hub = where.startswith(PREFIX)
        return f"{where} was refused ({status}): the repository is private or gated. " + (
            "Accept its terms on the hub, then set HF_TOKEN to a token that may read it."
            if hub
            else "Give a URL that needs no login, or for a file on the hub set HF_TOKEN."
        )
    if status == 404:
        name = where.rstrip("/").rsplit("/", 1)[-1]
        return (
            f"{where} does not exist (404): no file {name} there. Check the repository and the file "
            "name; the hub's file list shows them."
        )
    return f"{where} answered {status}; try again later, or check the address."
