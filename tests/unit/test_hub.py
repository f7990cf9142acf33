"""hf:// sources are read one way everywhere, and HF_TOKEN goes to the hub and nowhere else."""

from __future__ import annotations

import pytest

from llmgw.compiler.source import classify_source
from llmgw.engines import fetched_weights
from llmgw.hub import auth_headers, hub_source


def test_a_file_and_a_repository_read_the_same_in_every_stage(tmp_path) -> None:
    file = hub_source("hf://org/repo/sub/model-Q4_K_M.gguf")
    assert file is not None and (file.repo_id, file.filename) == ("org/repo", "sub/model-Q4_K_M.gguf")
    repo = hub_source("hf://org/repo")
    assert repo is not None and (repo.repo_id, repo.filename) == ("org/repo", None)
    assert hub_source("https://example.invalid/x.gguf") is None
    # The compiler's reading and the renderer's agree with it.
    assert classify_source("hf://org/repo/sub/model-Q4_K_M.gguf", tmp_path).repository == "hf://org/repo"
    assert fetched_weights("hf://org/repo/sub/model-Q4_K_M.gguf", "/w") == "/w/sub/model-Q4_K_M.gguf"
    assert fetched_weights("hf://org/repo", "/w") == "/w"


def test_the_file_url_is_on_the_hub_this_process_is_pointed_at(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9/")
    source = hub_source("hf://org/repo/model.gguf")
    assert source is not None
    assert source.url() == "http://127.0.0.1:9/org/repo/resolve/main/model.gguf"


def test_the_token_goes_to_the_hub_and_never_to_another_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.7:8080")
    assert auth_headers("http://127.0.0.7:8080/org/repo/resolve/main/m.gguf") == {
        "Authorization": "Bearer hf_secret"
    }
    assert auth_headers("https://huggingface.co/org/repo/resolve/main/m.gguf") != {}
    assert auth_headers("http://127.0.0.8/m.gguf") == {}, "a URL on another host must not get the token"
    monkeypatch.delenv("HF_TOKEN")
    assert auth_headers("https://huggingface.co/org/repo/resolve/main/m.gguf") == {}
