"""Write a file so that a reader sees the old content or the new, never half of either.

The new content goes to a temporary file beside the target, then is renamed over it.
A rename replaces whatever the name points at, so it is done only over a regular file
or a name that does not exist yet: `llmgw plan --out /dev/null`, run as root in CI,
once turned the machine's /dev/null into a regular file holding a plan. Anything else
(a device, a FIFO, a process substitution's /dev/fd/N) is written to directly, as a
shell redirection would. A symlink is followed, so the file it points at gets the new
content and the link stays a link.

`file_signature` is the reader's side: a file replaced this way has a new identity, which
the gateway (plan, keys) and the node agent (plan) poll for.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def replace_file(path: Path, data: bytes, tag: str = "tmp") -> None:
    """Write `data` to `path` through a rename when that is safe, else directly.

    Raises OSError as open() and os.replace() do; callers turn it into their own sentence.
    """
    try:
        mode = os.stat(path).st_mode  # follows symlinks
    except FileNotFoundError:
        mode = None
    except NotADirectoryError:
        mode = None  # a parent is a file: the write below fails with the reason
    if mode is not None and not stat.S_ISREG(mode):
        with open(path, "wb") as out:  # a directory fails here, with IsADirectoryError
            out.write(data)
        return
    # realpath, not resolve(): only regular files and missing names get here, and a
    # dangling symlink is then created at the file it names, as open() would.
    target = Path(os.path.realpath(path))
    tmp = target.with_name(f".{target.name}.{tag}{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


Signature = tuple[int, int, int, int] | None


def file_signature(path: Path) -> Signature:
    """Device, inode, size and mtime: any of them changes when the file is replaced or
    written; None while it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
