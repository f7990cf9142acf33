"""Tokens from files: every token llmgw reads from its environment may instead be read from a
file the environment names (NAME_FILE), so none needs to sit in an environment `ps e` shows,
and a node's agent token can differ from every other node's.

    LLMGW_AGENT_TOKEN[_FILE]     the agent's token (`llmgw node`), or the gateway's for any
                                 agent without a token of its own
    LLMGW_AGENT_TOKENS_FILE      the gateway's: a YAML mapping of node name → that node's token
    LLMGW_ADMIN_TOKEN[_FILE], LLMGW_METRICS_TOKEN[_FILE]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.errors import UsageError
from llmgw.load import parsed_or_refused


def token_from(env: Mapping[str, str], name: str) -> str | None:
    """NAME_FILE's first line when set, else NAME; None when neither is."""
    path = env.get(f"{name}_FILE")
    if not path:
        return env.get(name) or None
    try:
        token = Path(path).read_text(encoding="utf-8").strip().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"{name}_FILE={path} cannot be read ({exc}); point it at a file holding the token."
        ) from None
    if not token or not token[0].strip():
        raise UsageError(f"{name}_FILE={path} is empty; write the token on its first line.")
    return token[0].strip()


@dataclass(frozen=True)
class AgentTokens:
    """The token for each node's agent: its own when the tokens file names it, else the one
    token; one node's token opens no other node."""

    default: str | None = None
    by_node: Mapping[str, str] = field(default_factory=dict)

    def for_node(self, node: str | None) -> str | None:
        if node is not None and node in self.by_node:
            return self.by_node[node]
        return self.default

    @property
    def any(self) -> bool:
        return self.default is not None or bool(self.by_node)


def agent_tokens_from(env: Mapping[str, str]) -> AgentTokens:
    default = token_from(env, "LLMGW_AGENT_TOKEN")
    path = env.get("LLMGW_AGENT_TOKENS_FILE")
    if not path:
        return AgentTokens(default)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"LLMGW_AGENT_TOKENS_FILE={path} cannot be read ({exc}); point it at a YAML file of "
            "node name: token lines."
        ) from None
    data = parsed_or_refused(text, path, "LLMGW_AGENT_TOKENS_FILE")
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in data.items()
    ):
        raise UsageError(
            f"{path} (LLMGW_AGENT_TOKENS_FILE) must map each node's name to its agent's token, "
            "one `node-a: TOKEN` line each."
        )
    return AgentTokens(default, dict(data))
