"""embedding-pooling: an embedding model on llama.cpp needs a pooling type, from its GGUF or
from --pooling, or llama-server loads it and refuses every request."""

from __future__ import annotations

from pathlib import Path

from tests.unit.gguf_files import write_gguf
from tests.unit.helpers import by_rule, model_yaml, run

EMBEDDING = "task: embedding\n"


def _local(tmp_path: Path, *, pooling: int | None = None, args: str = "") -> list[tuple[str, str]]:
    (tmp_path / "catalog").mkdir()
    write_gguf(tmp_path / "catalog" / "m.gguf", "gemma3", pooling=pooling)
    profile = f"    args: {args}\n" if args else ""
    result = run(tmp_path, {"m.yaml": model_yaml(source="m.gguf", weights=None, extra=EMBEDDING,
                                                 profile_extra=profile)})
    return [(f.severity, f.message) for f in by_rule(result, "embedding-pooling")]


def test_a_chat_gguf_served_for_embeddings_without_pooling_is_an_error_saying_what_to_add(
    tmp_path: Path,
) -> None:
    [(severity, message)] = _local(tmp_path)
    assert severity == "error"
    assert "names no pooling type (its header has no gemma3.pooling_type" in message, message
    assert "Pooling type 'none' is not OAI compatible" in message and "add --pooling mean" in message


def test_the_hint_followed_lints_clean(tmp_path: Path) -> None:
    assert _local(tmp_path, args="[--pooling, mean]") == []


def test_pooling_none_is_no_pooling(tmp_path: Path) -> None:
    assert [s for s, _ in _local(tmp_path, args="[--pooling=none]")] == ["error"]


def test_a_gguf_that_names_its_pooling_needs_no_argument(tmp_path: Path) -> None:
    assert _local(tmp_path, pooling=1) == []


def test_a_remote_gguf_is_unknown_so_a_warning_not_an_error(tmp_path: Path) -> None:
    result = run(tmp_path, {"m.yaml": model_yaml(extra=EMBEDDING)})
    [finding] = by_rule(result, "embedding-pooling")
    assert finding.severity == "warning" and "cannot tell" in finding.message
    assert finding.line == 8, "at the profile, where the fix goes"


def test_chat_models_and_vllm_are_not_asked_for_pooling(tmp_path: Path) -> None:
    vllm = model_yaml("embed", source="hf://BAAI/bge-m3", engine="vllm", extra=EMBEDDING)
    result = run(tmp_path, {"chat.yaml": model_yaml("chat"), "embed.yaml": vllm})
    assert by_rule(result, "embedding-pooling") == []
