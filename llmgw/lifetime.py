"""A child process that ends with its parent, however the parent ends.

A parent killed outright (SIGKILL, the OOM killer, a closed terminal with no handler run)
cannot stop its children: `llmgw up`'s agent and gateway, and gunicorn's workers, kept
running with parent 1 and held the ports the restarted service needed. The kernel can:
PR_SET_PDEATHSIG asks it to signal the child when its parent thread exits.

Beneath the gateway and `up` alike; only the standard library.
"""

from __future__ import annotations

import ctypes
import os

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int, parent: int | None = None) -> None:
    """Have the kernel send `sig` to this process when its parent exits. With `parent`, a
    parent that already exited before the request took effect ends this process at once."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    if parent is not None and os.getppid() != parent:
        os._exit(1)
