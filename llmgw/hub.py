"""`hf://` sources: the one reading of them, the hub's URLs, and where the token may go.

    hf://org/repo               a repository: vLLM is handed `org/repo` and fetches it itself
    hf://org/repo/path/f.gguf   one file in it: downloaded, inspected, or handed to llama.cpp

Every stage that meets an hf:// source asks here, because five hand-written readings of it
had drifted: one built the file's URL with the revision fixed to `main` by hand, and two
disagreed on which hosts may receive HF_TOKEN.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlparse

PREFIX = "hf://"
DEFAULT_ENDPOINT = "https://huggingface.co"
# The hub's own names: a download from either may carry the token, as huggingface_hub's does.
_HUB_HOSTS = frozenset({"huggingface.co", "hf.co"})


@dataclass(frozen=True)
class HubSource:
    repo_id: str  # org/repo
    filename: str | None  # the file's path in the repository; None for the repository itself

    @property
    def repository(self) -> str:
        return PREFIX + self.repo_id

    def url(self) -> str:
        """The file's download URL on the hub this process is pointed at (HF_ENDPOINT)."""
        from huggingface_hub import hf_hub_url  # imported when needed: it brings much with it

        assert self.filename is not None, "a repository has no single file to download"
        return hf_hub_url(self.repo_id, self.filename, endpoint=endpoint())


def hub_source(text: str) -> HubSource | None:
    """The source as a hub reference, or None when it is not an hf:// source. Empty path
    parts are ignored (hf://org//repo/f reads as hf://org/repo/f), as the hub ignores them."""
    if not text.startswith(PREFIX):
        return None
    parts = [p for p in text[len(PREFIX) :].split("/") if p]
    return HubSource("/".join(parts[:2]), "/".join(parts[2:]) or None)


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def auth_headers(url: str) -> dict[str, str]:
    """HF_TOKEN for a request to the hub, and only to the hub: an https:// source on another
    host, or a redirect to one, must never receive it."""
    token = os.environ.get("HF_TOKEN")
    if not token:
        return {}
    host = urlparse(url).hostname
    if host not in _HUB_HOSTS and host != urlparse(endpoint()).hostname:
        return {}
    return {"Authorization": f"Bearer {token}"}
