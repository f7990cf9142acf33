"""The APIs the gateway serves, one row per kind: where it is, what it needs, how it answers.

The router (which models answer a kind, and where on the engine), the body checks (the
length fields), prefix routing (the prompt's fields), the limits and the meter (what counts,
whose usage must be asked for), the errors (whose shape), traces (the operation's name) and
the OpenAPI page all read these rows, so a new endpoint is one row here and its description
in pages/openapi.py, not a list in each of them.

Beneath every room of the gateway: it imports nothing of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# How an API reports the tokens an answer used:
#   openai        `prompt_tokens` and `completion_tokens`; a stream says so only when asked
#                 (`stream_options.include_usage`), which the gateway does on every stream
#   input_output  `input_tokens` and `output_tokens` (OpenAI's Responses, Anthropic's
#                 Messages and count_tokens), always sent
#   none          no usage at all
Usage = Literal["openai", "input_output", "none"]
# Whose shape its errors take: OpenAI's `{"error": {...}}`, or Anthropic's `{"type": "error", ...}`.
ErrorShape = Literal["openai", "anthropic"]
# How its stream is made, and so how a stream cut off ends: `data:` events (OpenAI's chat and
# completions), `event: response.*` (Responses), `event: message_*` (Messages).
Events = Literal["openai", "responses", "anthropic"]
# Where the prompt's leading part is, for prefix routing (request/prefix.py):
#   messages  a list of chat messages in `prompt_fields[0]`
#   text      a string (or a list whose first is one) in `prompt_fields[0]`
#   lead      a system prompt in `prompt_fields[0]` beside the turns in `prompt_fields[1]`
#   none      nothing worth routing by
Prompt = Literal["messages", "text", "lead", "none"]


@dataclass(frozen=True)
class Api:
    kind: str
    path: str  # where the gateway serves it, POST
    upstream: str  # where the engine serves it
    tasks: frozenset[str]  # the model tasks that answer it
    # Every field an engine reads as the answer's length limit for this kind; the first is
    # the one the gateway writes a model's max_output into when the request sets none. Empty
    # for a kind that generates nothing.
    length_fields: tuple[str, ...] = ()
    usage: Usage = "openai"
    errors: ErrorShape = "openai"
    events: Events = "openai"
    streams: bool = False
    # It counts tokens rather than generating them: toward a key's rpm, never its tpm, since
    # a client that counts first would otherwise pay for its prompt twice.
    counts_only: bool = False
    needs_model: bool = True  # the body names a model from GET /v1/models
    prompt: Prompt = "none"
    prompt_fields: tuple[str, ...] = ()
    # The OpenTelemetry GenAI conventions' operation name its spans carry; None: the kind.
    operation: str | None = None

    @property
    def trace_operation(self) -> str:
        return self.operation or self.kind

    @property
    def generates(self) -> bool:
        return bool(self.length_fields)

    @property
    def asks_for_usage(self) -> bool:
        """A stream of it must be asked for its usage; the other APIs always send theirs."""
        return self.streams and self.usage == "openai"


# A chat model also completes raw prompts (llama.cpp and vLLM both serve /v1/completions for
# it); the reverse is not true: a base model has no chat template, and an embedding model
# generates nothing. Responses and Messages are chat in another API's words: they need the
# chat template. Order is the order /v1/models and the error for an unknown path list them.
_CHAT = frozenset({"chat"})
_ROWS = (
    # vLLM reads max_tokens and max_completion_tokens, llama.cpp n_predict as well.
    Api(
        "chat",
        "/v1/chat/completions",
        "/v1/chat/completions",
        _CHAT,
        ("max_tokens", "max_completion_tokens", "n_predict"),
        streams=True,
        prompt="messages",
        prompt_fields=("messages",),
        operation="chat",
    ),
    Api(
        "completion",
        "/v1/completions",
        "/v1/completions",
        frozenset({"chat", "completion"}),
        ("max_tokens", "n_predict"),
        streams=True,
        prompt="text",
        prompt_fields=("prompt",),
        operation="text_completion",
    ),
    Api("embedding", "/v1/embeddings", "/v1/embeddings", frozenset({"embedding"}), operation="embeddings"),
    Api(
        "responses",
        "/v1/responses",
        "/v1/responses",
        _CHAT,
        # llama-server passes the Responses and Messages APIs on to its chat, which reads
        # n_predict before the OpenAI fields.
        ("max_output_tokens", "max_tokens", "n_predict"),
        usage="input_output",
        events="responses",
        streams=True,
        prompt="lead",
        prompt_fields=("instructions", "input"),
        operation="chat",  # the Responses API is a chat in another API's words
    ),
    Api(
        "messages",
        "/v1/messages",
        "/v1/messages",
        _CHAT,
        ("max_tokens", "n_predict"),
        usage="input_output",
        errors="anthropic",
        events="anthropic",
        streams=True,
        prompt="lead",
        prompt_fields=("system", "messages"),
        operation="chat",  # so is Anthropic's Messages API
    ),
    Api(
        "count_tokens",
        "/v1/messages/count_tokens",
        "/v1/messages/count_tokens",
        _CHAT,
        usage="input_output",
        errors="anthropic",
        counts_only=True,
    ),
    Api("rerank", "/v1/rerank", "/v1/rerank", frozenset({"rerank"})),
    # llama-server's /tokenize, served under /v1 with the rest of the API.
    Api(
        "tokenize",
        "/v1/tokenize",
        "/tokenize",
        frozenset({"chat", "completion"}),
        usage="none",
        counts_only=True,
    ),
)
APIS: dict[str, Api] = {api.kind: api for api in _ROWS}

# Every length field of every kind, in the order a request's own limit is looked for.
LENGTH_FIELDS: tuple[str, ...] = tuple(dict.fromkeys(f for api in _ROWS for f in api.length_fields))


def answered_by(task: str) -> list[Api]:
    """The APIs a model of `task` answers, in the table's order."""
    return [api for api in _ROWS if task in api.tasks]
