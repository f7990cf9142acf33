"""args-owned and args-risky: a pull request cannot move an engine off the address, port,
name, weights or context the plan gives it, and a reviewer sees flags that reach further."""

from __future__ import annotations

import pytest

from tests.unit.helpers import by_rule, model_yaml, run

VLLM_SOURCE = "hf://Qwen/Qwen2.5-7B-Instruct"
GPU = "{pool: gpu}"


def _owned(tmp_path, args: str, engine: str = "llamacpp") -> list[str]:
    extra = {"source": VLLM_SOURCE, "selector": GPU} if engine == "vllm" else {}
    result = run(
        tmp_path,
        {"m.yaml": model_yaml(engine=engine, profile_extra=f"    args: {args}\n", **extra)},
    )
    return [f.message for f in by_rule(result, "args-owned")]


@pytest.mark.parametrize(
    "args",
    [
        "[--host, 0.0.0.0]",
        '[--port, "18555"]',
        "[--port=18555]",
        "[--alias, other]",
        "[-a, other]",
        "[-m, /tmp/other.gguf]",
        "[--model=/tmp/other.gguf]",
        '[-c, "4096"]',
        "[--ctx-size=4096]",
        "[-hf, org/repo]",
    ],
)
def test_llamacpp_args_that_set_what_llmgw_sets_are_errors(tmp_path, args):
    found = _owned(tmp_path, args)
    assert len(found) == 1, f"{args} passed lint: the engine would not run as the plan says"
    assert "llmgw sets itself" in found[0]


@pytest.mark.parametrize(
    "args",
    [
        "[--host, 0.0.0.0]",
        "[--port=18555]",
        "[--served-model-name, other]",
        "[--served_model_name, other]",
        "[--model, org/other]",
        '[--max-model-len, "4096"]',
        "[--max-model-len=4096]",
        '[--max-model, "4096"]',
        "[--config, /etc/flags.yaml]",
    ],
)
def test_vllm_args_that_set_what_llmgw_sets_are_errors(tmp_path, args):
    assert len(_owned(tmp_path, args, "vllm")) == 1, f"{args} passed lint"


def test_the_refusal_names_the_field_to_write_instead(tmp_path):
    (port,) = _owned(tmp_path, '[--port, "18555"]')
    assert "fleet.yaml nodes[].ports" in port
    (name,) = _owned(tmp_path, "[--served-model-name, other]", "vllm")
    assert "`name` and `aliases`" in name
    (context,) = _owned(tmp_path, '[--max-model-len, "4096"]', "vllm")
    assert "`context_length`" in context


def test_flags_llmgw_does_not_set_and_their_values_pass(tmp_path):
    assert _owned(tmp_path, '[--parallel, "4", --threads, "2", --n-gpu-layers, "-1"]') == []
    assert _owned(tmp_path, "[--quantization, awq, --max-num-seqs, '8', --model-impl, vllm]", "vllm") == []


def test_flags_that_write_serve_or_run_code_are_warnings_the_reviewer_sees(tmp_path):
    result = run(tmp_path, {
        "a.yaml": model_yaml("a", profile_extra="    args: [--log-file, /etc/cron.d/x, --path=/]\n"),
        "b.yaml": model_yaml(
            "b", engine="vllm", source=VLLM_SOURCE, selector=GPU,
            profile_extra="    args: [--trust-remote-code]\n",
        ),
    })
    risky = by_rule(result, "args-risky")
    assert [(f.file.rsplit("/", 1)[-1], f.severity) for f in risky] == [
        ("a.yaml", "warning"), ("a.yaml", "warning"), ("b.yaml", "warning")]
    assert "runs Python code from the model's repository" in risky[2].message
    assert risky[0].line == 10 and risky[0].column > 1  # at the flag itself
