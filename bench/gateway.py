"""What the gateway costs: the same requests, straight to a fake engine, through nginx, and
through llmgw.

    .venv/bin/python bench/gateway.py [--seconds 5] [--connections 64] [--workers 2] [--traced]
                                      [--slots 4]

Measures, in one run and against the same fast fake engine (tests/gateway/fake_engine.py):
latency at one connection (sequential requests) and throughput at many connections, direct,
through nginx's `proxy_pass` (Debian's nginx-light, as many worker processes as the gateway
has workers, keep-alive to the engine), through the floor (bench/proxy_floor.py: the least
a proxy on the gateway's own stack can do, falcon on uvicorn forwarding over the gateway's
transport) and through a real gateway (gunicorn + uvicorn workers). Latency is measured in
short blocks that take turns between the four, and a proxy's added latency is the median,
over blocks, of its p50 less the engine's in the same turn. It prints that and the added
p99, requests per second, the gateway's throughput as a share of
nginx's, and the CPU time the workers of the floor and the gateway spent per request (read
from /proc: steadier than wall-clock figures on a shared machine).

The load generator is a raw asyncio HTTP/1.1 client with keep-alive, so it spends as little
CPU as it can: on a 2-core machine it, the engine and the proxy share the cores, so the
figures understate what either proxy does on a machine of its own. nginx is skipped, and
said so, when it is not installed (`apt-get install nginx-light`).

--litellm PATH adds LiteLLM's proxy (the `litellm` command of a virtualenv of its own:
`python3 -m venv /tmp/litellm && /tmp/litellm/bin/pip install 'litellm[proxy]'`; it is no
dependency of llmgw) in the same turns, forwarding to the same engine with as many workers,
and prints the gateway's added latency as a fraction of LiteLLM's. Its price list is read
from the package (LITELLM_LOCAL_MODEL_COST_MAP), so it reaches nothing beyond the machine.

--slots N adds a gateway, `slots`, whose plan gives the engine N slots (llama-server's
default is 4), so the connections keep them full and every answer hands its slot to a request
that waits, often in the other worker: its throughput beside the gateway's with slots to
spare says what a hand-off costs.

--traced adds a second gateway, `traced`, exporting a span per request by OTLP/HTTP to a
receiver on loopback (tests/gateway/otlp_receiver.py, decoding each batch as a collector
would), in the same turns: what tracing costs, beside the same gateway without it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httptools

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gateway"))
import harness  # noqa: E402

BODY = json.dumps(
    {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
).encode()


class _Client(asyncio.Protocol):
    """One keep-alive connection; `request()` sends one POST and waits for its whole answer."""

    def __init__(self, host: str, path: str) -> None:
        self.head = (
            f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(BODY)}\r\n\r\n"
        ).encode() + BODY
        self.parser = httptools.HttpResponseParser(self)
        self.done: asyncio.Future[int] | None = None
        self.transport: asyncio.Transport | None = None
        self.address: tuple[str, int] = ("", 0)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(self.parser.get_status_code())

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("connection lost"))

    async def request(self) -> int:
        assert self.transport is not None
        if self.transport.is_closing():
            # Idle past gunicorn's 2 s keep-alive while the other targets took their turn (a
            # loaded machine): connected again, in the first request's time of a block.
            await asyncio.get_running_loop().create_connection(lambda: self, *self.address)
            self.parser = httptools.HttpResponseParser(self)
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(self.head)
        return await self.done


async def _connect(url: str, path: str) -> _Client:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(lambda: _Client(host, path), host, int(port))
    client.address = (host, int(port))
    return client


async def latency_blocks(
    urls: dict[str, str], path: str, blocks: int, per_block: int
) -> dict[str, list[list[float]]]:
    """Sequential requests on one kept-alive connection per target, in short blocks that take
    turns (the order reversed every other block): each target's times, block by block.

    Taking turns is what makes the figures comparable: on a shared virtual machine the
    speed of everything drifts by half within a minute, and a target measured in one long
    stretch was measured on another machine than the target before it.
    """
    clients = {name: await _connect(url, path) for name, url in urls.items()}
    return await in_turns(clients, blocks, per_block)


async def in_turns(clients: dict[str, _Client], blocks: int, per_block: int) -> dict[str, list[list[float]]]:
    """Warm each client up, then time `per_block` sequential requests per client per block,
    the clients taking turns (the order reversed every other block); closes them after."""
    for client in clients.values():
        for _ in range(200):  # warm up: connection pools, caches, branch predictors
            await client.request()
    samples: dict[str, list[list[float]]] = {name: [] for name in clients}
    for block in range(blocks):
        for name in list(clients) if block % 2 == 0 else list(reversed(clients)):
            client, times = clients[name], []
            for _ in range(per_block):
                start = time.perf_counter()
                status = await client.request()
                times.append(time.perf_counter() - start)
                if status != 200:
                    raise SystemExit(f"bench request to {name} answered {status}")
            samples[name].append(times)
    for client in clients.values():
        assert client.transport is not None
        client.transport.close()
    return samples


async def throughput(url: str, path: str, connections: int, seconds: float) -> tuple[float, int]:
    clients = [await _connect(url, path) for _ in range(connections)]
    done = 0
    errors = 0
    stop_at = 0.0

    async def run(client: _Client) -> None:
        nonlocal done, errors
        while time.perf_counter() < stop_at:
            if await client.request() == 200:
                done += 1
            else:
                errors += 1

    stop_at = time.perf_counter() + 1.0  # warm up for a second, not counted
    await asyncio.gather(*(run(c) for c in clients))
    done = 0
    start = time.perf_counter()
    stop_at = start + seconds
    await asyncio.gather(*(run(c) for c in clients))
    elapsed = time.perf_counter() - start
    for c in clients:
        assert c.transport is not None
        c.transport.close()
    if errors:
        raise SystemExit(f"{errors} bench requests failed")
    return done / elapsed, done


NGINX_CONF = """\
daemon off;
master_process on;
worker_processes {workers};
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 10000000;  # the bench's connections live for the whole run
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    upstream engine {{ server {engine}; keepalive 256; keepalive_requests 10000000; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


@contextlib.contextmanager
def nginx(engine_url: str, workers: int) -> Iterator[str | None]:
    """nginx proxying to the engine, as the reference a proxy can be held to; None without it."""
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if binary is None:
        yield None
        return
    with tempfile.TemporaryDirectory() as tmp:
        port = harness.free_port()
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(
            NGINX_CONF.format(workers=workers, dir=tmp, port=port, engine=engine_url.removeprefix("http://"))
        )
        with _serving([binary, "-c", str(conf), "-p", tmp], port, "nginx", 10) as (url, _):
            yield url


LITELLM_CONFIG = """\
model_list:
  - model_name: bench
    litellm_params:
      model: openai/bench
      api_base: {engine}/v1
      api_key: none
litellm_settings:
  telemetry: false
general_settings:
  # The gateway in this bench has no keys either: both accept every request.
  dangerously_permit_weak_or_unset_master_key: true
"""
# Its access log off, as the gateway's is here (uvicorn's logger, which LiteLLM's server uses).
LITELLM_LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {"uvicorn.access": {"level": "WARNING"}},
}


@contextlib.contextmanager
def litellm(binary: str | None, engine_url: str, workers: int) -> Iterator[tuple[str, int] | None]:
    """LiteLLM's proxy forwarding to the engine, and its process id; None when not asked for."""
    if binary is None:
        yield None
        return
    with tempfile.TemporaryDirectory() as tmp:
        port = harness.free_port()
        config = Path(tmp) / "config.yaml"
        config.write_text(LITELLM_CONFIG.format(engine=engine_url))
        logging = Path(tmp) / "logging.json"
        logging.write_text(json.dumps(LITELLM_LOGGING))
        env = os.environ | {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
        argv = [binary, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--num_workers", str(workers), "--log_config", str(logging)]
        with _serving(argv, port, "LiteLLM's proxy", 120, env) as (url, proc):
            yield url, proc.pid


@contextlib.contextmanager
def floor(engine_url: str, workers: int) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """bench/proxy_floor.py under gunicorn, as many workers as the gateway: the least a proxy
    on the gateway's stack costs."""
    port = harness.free_port()
    env = harness.subprocess_env(LLMGW_FLOOR_ENGINE=engine_url.removeprefix("http://"))
    argv = [sys.executable, "-m", "gunicorn", "proxy_floor:app", "--chdir", str(Path(__file__).parent)]
    argv += ["--worker-class", "uvicorn_worker.UvicornWorker", "--workers", str(workers)]
    argv += ["--bind", f"127.0.0.1:{port}", "--access-logfile", "/dev/null", "--error-logfile", "-"]
    with _serving(argv, port, "the floor proxy", 20, env) as served:
        yield served


@contextlib.contextmanager
def _serving(
    argv: list[str], port: int, what: str, timeout: float, env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A proxy started on `port`, once it answers a chat request; stopped after."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        harness.wait_until(lambda: _answers(url), timeout, f"{what} to listen")
        yield url, proc
    finally:
        harness.stop(proc)


def _answers(url: str) -> bool:
    import httpx

    return httpx.post(url + "/v1/chat/completions", content=BODY, timeout=5).status_code == 200


def cpu_seconds(pids: set[int]) -> float:
    """User and system CPU time the processes have used, from /proc."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per throughput run")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=20, help="of sequential requests, taking turns")
    parser.add_argument("--block-requests", type=int, default=500, help="sequential, per block")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="of throughput; medians are reported")
    parser.add_argument(
        "--access-log", action="store_true", help="keep the JSON access log on (written to a file)"
    )
    parser.add_argument("--traced", action="store_true", help="and a gateway exporting traces")
    parser.add_argument("--slots", type=int, default=0, help="and a gateway giving the engine N slots")
    parser.add_argument("--litellm", metavar="PATH", help="and LiteLLM's proxy: its `litellm` command")
    args = parser.parse_args()
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run

    slots = ("--parallel", str(max(args.connections, 1)))
    with tempfile.TemporaryDirectory() as tmp, harness.engine("bench", "127.0.0.2") as engine:
        plan_path = Path(tmp) / "plan.json"
        harness.write_plan(
            plan_path,
            # The fake engine answers any number at once: its slots say so, so the gateway
            # (which sends a replica no more than its slots) holds nothing back from it.
            harness.plan(
                [
                    harness.model(
                        "bench", [harness.profile([engine.url], "bench", args=slots)], max_output=4096
                    )
                ]
            ),
        )
        few_path = Path(tmp) / "few-slots.json"
        if args.slots:
            few = ("--parallel", str(args.slots))
            harness.write_plan(
                few_path,
                harness.plan(
                    [
                        harness.model(
                            "bench", [harness.profile([engine.url], "bench", args=few)], max_output=4096
                        )
                    ]
                ),
            )
        env = {} if args.access_log else {"LLMGW_ACCESS_LOG": "off"}
        with (
            nginx(engine.url, args.workers) as nginx_url,
            floor(engine.url, args.workers) as (floor_url, floor_proc),
            harness.gateway(plan_path, workers=args.workers, **env) as gw,
            traced_gateway(plan_path, args.workers, env, args.traced) as traced,
            litellm(args.litellm, engine.url, args.workers) as lite,
            few_slots_gateway(few_path, args.workers, env, args.slots) as full,
        ):
            urls = {"direct": engine.url}
            # With --traced, nginx sits out: a fifth target in the turns left each kept-alive
            # connection idle past gunicorn's 2 s keep-alive on a loaded machine.
            if nginx_url is not None and not args.traced:
                urls["nginx"] = nginx_url
            urls |= {"floor": floor_url, "gateway": gw.url}
            pids = {"floor": harness.children(floor_proc.pid), "gateway": gw.worker_pids()}
            if traced is not None:
                urls["traced"] = traced[0].url
                pids["traced"] = traced[0].worker_pids()
            if full is not None:
                urls["slots"] = full.url
                pids["slots"] = full.worker_pids()
            if lite is not None:
                urls["litellm"] = lite[0]
                pids["litellm"] = {lite[1], *harness.children(lite[1])}
            path = "/v1/chat/completions"
            samples = run(latency_blocks(urls, path, args.blocks, args.block_requests))
            # Throughput rounds take turns too, and the median of each figure is kept. CPU
            # is read from /proc around each run; its one-second warm-up counts as requests.
            rps: dict[str, list[float]] = {name: [] for name in urls}
            cpu: dict[str, list[float]] = {name: [] for name in pids}
            for _ in range(args.rounds):
                for name, url in urls.items():
                    before = cpu_seconds(pids.get(name, set()))
                    rate, done = run(throughput(url, path, args.connections, args.seconds))
                    rps[name].append(rate)
                    if name in pids:
                        cpu[name].append((cpu_seconds(pids[name]) - before) / (done * (1 + 1 / args.seconds)))
            if traced is not None:
                time.sleep(1)  # the last batch
                print(f"spans received by the loopback collector: {len(traced[1].spans)}")
    report(args, samples, rps, cpu)


@contextlib.contextmanager
def few_slots_gateway(
    plan_path: Path, workers: int, env: dict[str, str], slots: int
) -> Iterator[harness.Gateway | None]:
    if not slots:
        yield None
        return
    with harness.gateway(plan_path, workers=workers, **env) as gw:
        yield gw


@contextlib.contextmanager
def traced_gateway(
    plan_path: Path, workers: int, env: dict[str, str], wanted: bool
) -> Iterator[tuple[harness.Gateway, Any] | None]:
    if not wanted:
        yield None
        return
    from otlp_receiver import otlp_receiver

    with (
        otlp_receiver() as receiver,
        harness.gateway(plan_path, workers=workers, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, **env) as gw,
    ):
        yield gw, receiver


def report(
    args: argparse.Namespace,
    samples: dict[str, list[list[float]]],
    rps: dict[str, list[float]],
    cpu: dict[str, list[float]],
) -> None:
    names = list(samples)
    every = {name: [t for block in samples[name] for t in block] for name in names}
    # A proxy's added latency is taken block by block, against the engine's own in the same
    # turn, and the median of those is reported: drift between turns cancels out.
    added = {
        name: statistics.median(
            statistics.median(mine) - statistics.median(direct)
            for mine, direct in zip(samples[name], samples["direct"], strict=True)
        )
        for name in names[1:]
    }

    def ms(seconds: float) -> str:
        return f"{seconds * 1000:.3f} ms"

    print(f"{'':24}" + "".join(f"{n:>12}" for n in names))
    print("latency p50             " + "".join(f"{ms(statistics.median(every[n])):>12}" for n in names))
    print("latency p99             " + "".join(f"{ms(pct(every[n], 0.99)):>12}" for n in names))
    print(f"added latency p50{'':>19}" + "".join(f"{ms(added[n]):>12}" for n in names[1:]))
    print(
        f"added latency p99{'':>19}"
        + "".join(f"{ms(pct(every[n], 0.99) - pct(every['direct'], 0.99)):>12}" for n in names[1:])
    )
    print(
        f"throughput ({args.connections} conn)"
        + "".join(f"{statistics.median(rps[n]):>10.0f}/s" for n in names)
    )
    if "nginx" in rps:
        share = statistics.median(rps["gateway"]) / statistics.median(rps["nginx"])
        print(f"gateway throughput / nginx's: {share:.2f}")
    else:
        print("nginx not installed: no reference (apt-get install nginx-light)")
    print(
        f"CPU per request: gateway {statistics.median(cpu['gateway']) * 1e6:.0f} us, floor "
        f"{statistics.median(cpu['floor']) * 1e6:.0f} us (their workers, from /proc)"
    )
    print(
        "floor: the least a proxy on the gateway's stack costs (bench/proxy_floor.py: falcon on "
        "uvicorn's worker, the gateway's transport, no features)"
    )
    blocks = samples["gateway"]
    print(
        f"gateway: {args.workers} worker(s), access log {'on' if args.access_log else 'off'}; "
        f"latency in {len(blocks)} turns of {len(blocks[0])} requests, throughput the median of "
        f"{args.rounds} rounds; machine: {os.cpu_count()} cores"
    )
    print(f"rounds (gateway rps): {[round(r) for r in rps['gateway']]}")
    if "litellm" in added:
        print(
            f"LiteLLM: added latency p50 {ms(added['litellm'])}, the gateway's {ms(added['gateway'])}: "
            f"1/{added['litellm'] / added['gateway']:.0f} of it; CPU per request "
            f"{statistics.median(cpu['litellm']) * 1e6:.0f} us; throughput "
            f"{statistics.median(rps['gateway']) / statistics.median(rps['litellm']):.1f}x LiteLLM's"
        )
    if "slots" in rps:
        print(
            f"{args.slots} slots kept full by {args.connections} connections: "
            f"{statistics.median(rps['slots']):.0f}/s, "
            f"{statistics.median(rps['slots']) / statistics.median(rps['gateway']):.2f} of the gateway's "
            "with slots to spare"
        )
    if "traced" in cpu:
        print(
            f"tracing: added latency p50 {ms(added['traced'] - added['gateway'])}, CPU per request "
            f"{(statistics.median(cpu['traced']) - statistics.median(cpu['gateway'])) * 1e6:+.0f} us, "
            f"throughput {statistics.median(rps['traced']) / statistics.median(rps['gateway']):.2f} "
            "of untraced"
        )


if __name__ == "__main__":
    main()
