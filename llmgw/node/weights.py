"""A model's `source` → what its engine loads on this node.

    local path            used as it is: it names a file on the node (relative: to the model
                          file's folder, as `llmgw plan` read it, from the agent's directory)
    hf://org/repo/file    downloaded by huggingface_hub into its cache (HF_HOME, HF_ENDPOINT,
                          HF_TOKEN), which resumes a cut download
    hf://org/repo         a repository id, passed to vLLM, which fetches it itself
    https://…             downloaded here with HTTP Range resume, checked against weights_bytes

Blocking code: the agent runs it in a thread.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

import httpx

from llmgw.errors import LlmgwError
from llmgw.hub import auth_headers, hub_source
from llmgw.plan import PlanModel

Progress = Callable[[int], None]  # called with each block's size in bytes


class WeightsError(LlmgwError):
    """The weights cannot be had; the sentence says what to do. Retried after a backoff."""


def downloads(model: PlanModel) -> bool:
    """Whether getting the weights means fetching a file: a local path is only looked up,
    and a repository id is vLLM's to fetch."""
    hub = hub_source(model.source)
    if hub is not None:
        return hub.filename is not None
    return model.source.startswith(("https://", "http://"))


def weights_for(model: PlanModel, cache: Path, progress: Progress | None = None) -> str:
    """What the engine is handed: a file on this node, or a repository id for vLLM."""
    source = model.source
    hub = hub_source(source)
    if hub is not None:
        if hub.filename is None:
            return hub.repo_id  # a repository id: vLLM downloads it itself
        return _from_hub(hub.repo_id, hub.filename, progress)
    if source.startswith(("https://", "http://")):
        return str(_from_url(source, cache, model.weights_bytes, progress))
    path = Path(source)
    if not path.is_absolute():
        path = Path(model.file).parent / path
    if not path.exists():
        raise WeightsError(
            f"{model.name}'s weights {source} are not on this node (looked for {path.resolve()}). "
            "Copy the file there, or give the model an hf:// or https:// source the agent can download."
        )
    return str(path.resolve())


def fetch_into(source: str, directory: Path, expected: int | None = None) -> Path:
    """Download a model's weights into `directory`, at the path `engines.fetched_weights`
    names, for an engine in a container (Kubernetes' init container). A file already there
    whole is kept, so a pod restarted on a node with a persistent volume starts at once."""
    hub = hub_source(source)
    if hub is not None:
        return _into_from_hub(hub.repo_id, hub.filename, directory)
    if source.startswith(("https://", "http://")):
        name = PurePosixPath(urlparse(source).path).name or "weights"
        return _download_whole(source, directory / name, expected, None)
    raise WeightsError(
        f"{source} is a path on one machine, which a container cannot read; give the model an "
        "hf:// or https:// source, or run it with the node agent on the machine that has the file."
    )


def _into_from_hub(repo_id: str, filename: str | None, directory: Path) -> Path:
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    what = f"hf://{repo_id}" + (f"/{filename}" if filename else "")
    try:
        if filename is None:
            return Path(snapshot_download(repo_id, local_dir=directory))
        return Path(hf_hub_download(repo_id, filename, local_dir=directory))
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        raise WeightsError(_refusal(status, what, str(exc).splitlines()[0])) from None


def _from_hub(repo_id: str, filename: str, progress: Progress | None) -> str:
    # Imported here: huggingface_hub reads HF_ENDPOINT and HF_HOME when it is imported.
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return hf_hub_download(repo_id, filename)
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        raise WeightsError(_refusal(status, f"hf://{repo_id}/{filename}", str(exc).splitlines()[0])) from None
    except LocalEntryNotFoundError as exc:
        raise WeightsError(
            f"hf://{repo_id}/{filename} could not be fetched and is not in the cache: {exc}. "
            "Check that this node reaches the hub (HF_ENDPOINT) and is not offline (HF_HUB_OFFLINE)."
        ) from None


def _refusal(status: int | None, what: str, detail: str) -> str:
    if status in (401, 403):
        return (
            f"the hub refused {what} ({status}): the repository is private or gated. Accept its "
            "terms on the hub, then set HF_TOKEN to a token that may read it, in the agent's environment."
        )
    if status == 404:
        return (
            f"{what} does not exist ({status}): check the repository and the file name in the model's source."
        )
    return f"downloading {what} failed: {detail}"


def _from_url(url: str, cache: Path, expected: int | None, progress: Progress | None) -> Path:
    name = PurePosixPath(urlparse(url).path).name or "weights"
    folder = cache / hashlib.sha256(url.encode()).hexdigest()[:16]
    return _download_whole(url, folder / name, expected, progress)


def _download_whole(url: str, target: Path, expected: int | None, progress: Progress | None) -> Path:
    name, folder = target.name, target.parent
    if target.is_file() and (expected is None or target.stat().st_size == expected):
        return target
    folder.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(name + ".part")
    headers = auth_headers(url)
    # A few tries within one fetch, each resuming where the last stopped; past them the
    # agent's backoff tries again, still resuming, so a flaky link costs time, never bytes.
    for attempt in range(3):
        try:
            _download(url, partial, headers, progress)
            break
        except (httpx.TransportError, httpx.RemoteProtocolError) as exc:
            if attempt == 2:
                kept = partial.stat().st_size if partial.exists() else 0
                raise WeightsError(
                    f"downloading {url} broke off ({exc}); {kept} bytes are kept and the next try "
                    "resumes from there."
                ) from None
    size = partial.stat().st_size
    if expected is not None and size != expected:
        partial.unlink()
        raise WeightsError(
            f"{url} is {size} bytes but the plan says weights_bytes {expected}: the file changed on the "
            "server or the catalogue is wrong. Fix weights_bytes (llmgw inspect tells) or the URL."
        )
    os.replace(partial, target)
    return target


def _download(url: str, partial: Path, headers: dict[str, str], progress: Progress | None) -> None:
    have = partial.stat().st_size if partial.exists() else 0
    if have:
        headers = {**headers, "Range": f"bytes={have}-"}
    with httpx.stream(
        "GET", url, headers=headers, follow_redirects=True, timeout=30, trust_env=True
    ) as answer:
        if answer.status_code == 416 and have:  # the part already holds the whole file
            return
        if answer.status_code >= 400:
            raise WeightsError(_refusal(answer.status_code, url, f"HTTP {answer.status_code}"))
        mode = "ab" if have and answer.status_code == 206 else "wb"  # 200: the server ignored Range
        with partial.open(mode) as out:
            for block in answer.iter_bytes():  # as it arrives: a cut keeps every byte
                out.write(block)
                if progress:
                    progress(len(block))
