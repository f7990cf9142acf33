"""Write a file so that a reader sees the old content or the new, never half of either.

The new content goes to a temporary file beside the target, then is renamed over it.
A rename replaces whatever the name points at, so it is done only over a regular file
or a name that does not exist yet: `llmgw plan --out /dev/null`, run as root in CI,
once turned the machine's /dev/null into a regular file holding a plan. Anything else
(a device, a FIFO, a process substitution's /dev/fd/N) is written to directly, as a
shell redirection would. A symlink is followed, so the file it points at gets the new
content and the link stays a link.

The files a program keeps for itself beside another (the gateway's last-good copies, its
refusal record, its usage readings) are `owned`: a symlink at their name is refused, never
followed, since anyone who can write the plan's folder could otherwise have the gateway
overwrite whatever file the link names. The temporary file is always made new under a
name nobody can guess (O_EXCL, O_NOFOLLOW), for the same reason; and the data is on disk
(fsync of the file, then of its folder) before and after the rename, so a crash leaves the
old content or the new, never an empty file.

`file_signature` is the reader's side: a file replaced this way has a new identity, which
the gateway (plan, keys) and the node agent (plan) poll for.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path


def replace_file(path: Path, data: bytes, tag: str = "tmp", owned: bool = False) -> None:
    """Write `data` to `path` through a rename when that is safe, else directly; for an
    `owned` file, only through a rename, and never through a symlink.

    Raises OSError as open() and os.replace() do; callers turn it into their own sentence.
    """
    if owned:
        _refuse_unless_own(path)
        _write_and_rename(path, data, tag)
        return
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
    _write_and_rename(Path(os.path.realpath(path)), data, tag)


def _refuse_unless_own(path: Path) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        what = "a symlink" if stat.S_ISLNK(mode) else "not a regular file"
        raise OSError(
            errno.EPERM,
            f"{path} is {what}, and llmgw writes only files of its own there; remove it, "
            "and llmgw writes a new one",
        )


def _write_and_rename(target: Path, data: bytes, tag: str) -> None:
    tmp = target.with_name(f".{target.name}.{tag}{os.getpid()}.{secrets.token_hex(6)}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o666)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _sync_folder(target.parent)


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable: without it, a crash can bring back the old name."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        # Some filesystems cannot sync a folder; the file itself is on disk by then.
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


Signature = tuple[int, int, int, int] | None


def file_signature(path: Path) -> Signature:
    """Device, inode, size and mtime: any of them changes when the file is replaced or
    written; None while it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
