"""The one base error the CLI catches: a user's mistake that stops a command from running.

    LlmgwError          -> exit 2, its message printed as it is
      UsageError        a file or directory that is missing or unreadable
      PlanError         a plan that cannot be read or does not validate

Findings (lint results) are not errors: they are collected and reported.
"""

from __future__ import annotations


class LlmgwError(Exception):
    """A sentence to the person who must act; never a traceback."""


class UsageError(LlmgwError):
    pass


class PlanError(LlmgwError):
    pass
