"""Remote headers: HTTP Range requests for the header's bytes only, against a loopback server
that counts what it served. Nothing leaves the machine."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from llmgw.compiler.fetch import FIRST_RANGE
from llmgw.compiler.inspect import inspect
from llmgw.errors import InspectError
from tests.conftest import serve_on_loopback
from tests.unit.gguf_files import header_length, write_gguf

CHUNK = 64 * 1024
# The weights after the header are never stored: a 40 GB file costs nothing to pretend.
VIRTUAL_SIZE = 40_000_000_000


@dataclass
class Hub:
    """A file server on 127.0.0.1: the header's bytes, then zeros up to `size`."""

    prefix: bytes = b""
    size: int = VIRTUAL_SIZE
    ranges: bool = True
    status: int = 200  # anything else is answered instead of the file
    cut_after: int | None = None  # hang up after this many body bytes, Content-Length unmet
    delay: float = 0.0  # seconds before each chunk: a trickling server
    served: int = 0
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    url: str = ""

    def bytes_at(self, start: int, end: int) -> bytes:
        head = self.prefix[start:end]
        return head + bytes(max(0, end - max(start, len(self.prefix))))


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            hub.requests.append((self.path, dict(self.headers)))
            if hub.status != 200:
                self.send_response(hub.status)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            match = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
            if hub.ranges and match:
                start, end = int(match.group(1)), min(int(match.group(2)) + 1, hub.size)
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{hub.size}")
            else:
                start, end = 0, hub.size
                self.send_response(200)
            self.send_header("Content-Length", str(end - start))
            self.end_headers()
            try:
                for at in range(start, end, CHUNK):
                    if hub.cut_after is not None and at - start >= hub.cut_after:
                        return  # HTTP/1.0: the connection closes short of Content-Length
                    time.sleep(hub.delay)
                    block = hub.bytes_at(at, min(at + CHUNK, end))
                    self.wfile.write(block)
                    hub.served += len(block)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the reader has its header and hung up: what it should do

    return Handler


@pytest.fixture
def hub() -> Iterator[Hub]:
    state = Hub()
    with serve_on_loopback(_handler(state)) as state.url:
        yield state


def _header_of(path: Path) -> bytes:
    return path.read_bytes()[: header_length(path)]


def test_ranges_fetch_the_header_and_not_the_weights(hub, gemma_gguf):
    hub.prefix = _header_of(gemma_gguf)
    result = inspect(f"{hub.url}/gemma.gguf")
    assert result.size_bytes == VIRTUAL_SIZE  # from Content-Range
    assert result.header.architecture == "gemma3"
    # Ranges of 1, 2 and 4 MiB for a 6.5 MB header: three requests, under twice what it needs.
    assert len(hub.requests) == 3, hub.requests
    # The reader hangs up once it has the header, so the last range may be served in part.
    assert 2 * FIRST_RANGE < hub.served <= 7 * FIRST_RANGE, hub.served
    assert hub.requests[0][1]["Range"] == f"bytes=0-{FIRST_RANGE - 1}"


def test_a_small_header_costs_one_request(hub, tmp_path):
    hub.prefix = _header_of(write_gguf(tmp_path / "m.gguf"))
    assert inspect(f"{hub.url}/m.gguf").header.layers == 4
    assert len(hub.requests) == 1 and hub.served <= FIRST_RANGE


def test_a_file_shorter_than_the_first_range_is_read_whole(hub, tmp_path):
    path = write_gguf(tmp_path / "m.gguf")
    hub.prefix = path.read_bytes()
    hub.size = len(hub.prefix)
    result = inspect(f"{hub.url}/m.gguf")
    assert result.size_bytes == path.stat().st_size


def test_a_server_that_ignores_range_is_read_as_a_stream_and_closed(hub, gemma_gguf):
    hub.prefix = _header_of(gemma_gguf)
    hub.ranges = False
    result = inspect(f"{hub.url}/gemma.gguf")
    assert result.header.layers == 18
    assert result.size_bytes == VIRTUAL_SIZE  # from Content-Length
    assert len(hub.requests) == 1
    # Closed once the header was in: what was served is the header and what sat in the
    # sockets' buffers, not the 40 GB the server offered.
    assert hub.served < len(hub.prefix) + 16 * 2**20, hub.served


def test_hf_sources_resolve_on_hf_endpoint_with_the_token(hub, tmp_path, monkeypatch):
    hub.prefix = _header_of(write_gguf(tmp_path / "m.gguf"))
    monkeypatch.setenv("HF_ENDPOINT", hub.url + "/")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    inspect("hf://org/repo/sub/m.gguf")
    path, headers = hub.requests[0]
    assert path == "/org/repo/resolve/main/sub/m.gguf"
    assert headers["Authorization"] == "Bearer hf_secret"


def test_the_token_goes_to_the_hub_only(hub, tmp_path, monkeypatch):
    hub.prefix = _header_of(write_gguf(tmp_path / "m.gguf"))
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    inspect(f"{hub.url}/m.gguf")
    assert "Authorization" not in hub.requests[0][1]


@pytest.mark.parametrize("status", [401, 403])
def test_refused_says_hf_token(hub, monkeypatch, status):
    hub.status = status
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    with pytest.raises(InspectError, match=rf"hf://org/gated/m.gguf was refused \({status}\).*set HF_TOKEN"):
        inspect("hf://org/gated/m.gguf")


def test_missing_file_names_it(hub, monkeypatch):
    hub.status = 404
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    with pytest.raises(
        InspectError,
        match=r"hf://org/repo/nope-Q4_K_M.gguf does not exist \(404\): no file "
        r"nope-Q4_K_M.gguf there",
    ):
        inspect("hf://org/repo/nope-Q4_K_M.gguf")


def test_a_remote_file_that_is_not_gguf(hub):
    hub.prefix = b"<html>not found</html>"
    with pytest.raises(InspectError, match="is not a GGUF file"):
        inspect(f"{hub.url}/page.gguf")
    assert len(hub.requests) == 1 and hub.served <= FIRST_RANGE


def test_a_remote_header_cut_short(hub, gemma_gguf):
    hub.prefix = _header_of(gemma_gguf)
    hub.size = 2_000_000
    with pytest.raises(InspectError, match="ends 2000000 bytes in.*truncated"):
        inspect(f"{hub.url}/gemma.gguf")


def test_nothing_listening_is_a_sentence():
    with pytest.raises(InspectError, match=r"cannot reach http://127.0.0.1:9/m.gguf"):
        inspect("http://127.0.0.1:9/m.gguf")


def test_cli_reads_hf_endpoint_from_the_environment(llmgw, hub, tmp_path):
    hub.prefix = _header_of(write_gguf(tmp_path / "m.gguf", heads=16, kv_heads=4))
    run = llmgw("inspect", "hf://org/repo/m.gguf", "--format", "json", HF_ENDPOINT=hub.url)
    assert run.code == 0, run
    assert '"kv_heads": 4' in run.stdout


def test_a_body_cut_short_is_a_sentence_not_a_traceback(hub, tmp_path):
    hub.prefix = _header_of(write_gguf(tmp_path / "m.gguf", vocab=20_000))
    hub.cut_after = CHUNK
    with pytest.raises(
        InspectError, match=r"stopped sending 65536 bytes in \(RemoteProtocolError.*cut short"
    ):
        inspect(f"{hub.url}/m.gguf")


def test_a_trickling_server_meets_the_deadline(hub, tmp_path, monkeypatch):
    hub.prefix = _header_of(write_gguf(tmp_path / "m.gguf", vocab=20_000))
    hub.delay = 0.1
    monkeypatch.setenv("LLMGW_FETCH_DEADLINE", "0.25")
    with pytest.raises(InspectError, match=r"header in 0.25 s and was still sending.*LLMGW_FETCH_DEADLINE"):
        inspect(f"{hub.url}/m.gguf")


def test_a_deadline_that_is_not_seconds_is_named(monkeypatch):
    monkeypatch.setenv("LLMGW_FETCH_DEADLINE", "soon")
    with pytest.raises(InspectError, match="LLMGW_FETCH_DEADLINE is 'soon'"):
        inspect("http://127.0.0.1:9/m.gguf")
