"""Each engine's credential: a key of its own, so the engine answers only the gateway.

Anyone on a fleet's network can reach an engine's port; without a key an engine serves them,
past every key, limit, budget and fair line the gateway keeps. The agent makes one key per
replica, keeps it in its state directory (a 0600 file in a 0700 folder, as the token files
are), hands it to the engine through a file or the environment (never the command line,
which `ps` shows anyone on the machine), and tells it only to a caller with its token: the
gateway, which sends it on every request and never passes on what a client sent in its place.

The key outlives the agent: an engine adopted after a restart still takes the one it was
started with.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

FOLDER = "credentials"


def credential_for(state_dir: Path, replica_key: str) -> tuple[Path, str]:
    """The replica's key file and key, made on first use."""
    folder = state_dir / FOLDER
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    path = folder / (re.sub(r"[^A-Za-z0-9._-]", "_", replica_key) + ".key")
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        key = ""
    if key:
        return path, key
    key = "sk-engine-" + secrets.token_urlsafe(32)
    # Created 0600 from the start: a key written and then narrowed is readable in between.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key + "\n")
    return path, key
