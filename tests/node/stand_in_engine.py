"""A stand-in for llama-server or `vllm serve`, for the node agent's tests.

The tests put it on PATH as `llama-server` or `vllm`. It records how it was started (argv,
CUDA_VISIBLE_DEVICES, pid) as one JSON line in $STAND_IN_DIR/starts.jsonl, then serves the
fake engine's OpenAI API on the --host and --port it was given. Environment:

    STAND_IN_LOAD_S     GET /health answers 503 (loading) for this long, then 200
    STAND_IN_EXIT       print a line and exit with this code at once, as an engine that
                        cannot read its weights does
    STAND_IN_SIGNAL     print a line and die of this signal at once, as an engine built for
                        instructions the CPU does not run does (SIGILL)
    STAND_IN_SERVICE_S  work on at most --parallel requests at once (4 when absent, as
                        llama-server), each for this long, as the fake engine's slots do
    STAND_IN_IGNORE_TERM  ignore SIGTERM, as a llama-server busy with a stream does until the
                        agent's grace runs out and SIGKILL comes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.gateway.fake_engine import Engine, serve  # noqa: E402


def main() -> None:
    argv = sys.argv[1:]
    record = {
        "argv": [Path(os.environ["STAND_IN_AS"]).name, *argv],
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pid": os.getpid(),
        "time": time.time(),
    }
    folder = Path(os.environ["STAND_IN_DIR"])
    with (folder / "starts.jsonl").open("a") as out:
        out.write(json.dumps(record) + "\n")
    print(f"stand-in engine starting: {' '.join(argv)}", flush=True)
    if "STAND_IN_EXIT" in os.environ:
        print("error: failed to load model: unknown file magic", flush=True)
        sys.exit(int(os.environ["STAND_IN_EXIT"]))
    if "STAND_IN_SIGNAL" in os.environ:
        print("init: llama threadpool init, n_threads = 2", flush=True)
        sig = signal.Signals[os.environ["STAND_IN_SIGNAL"]]
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    if "STAND_IN_IGNORE_TERM" in os.environ:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--alias", "--served-model-name", dest="name", default="stand-in")
    parser.add_argument("--parallel", "-np", type=int, default=4)
    parser.add_argument("--api-key-file")  # llama-server's; vLLM reads VLLM_API_KEY
    args, _ = parser.parse_known_args(argv)
    key = Path(args.api_key_file).read_text().strip() if args.api_key_file else os.environ.get("VLLM_API_KEY")
    load_s = float(os.environ.get("STAND_IN_LOAD_S", "0"))
    service = os.environ.get("STAND_IN_SERVICE_S")
    slots = (args.parallel, float(service)) if service is not None else None
    asyncio.run(_serve(args.host, args.port, args.name, load_s, slots, key))


async def _serve(
    host: str, port: int, name: str, load_s: float, slots: tuple[int, float] | None, key: str | None
) -> None:
    engine = Engine(name, 503 if load_s else 200, None, *(slots or (None, 0.0)))
    engine.api_key = key
    server = await serve(host, port, engine)
    if load_s:
        await asyncio.sleep(load_s)
        engine.health_status = 200
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    main()
