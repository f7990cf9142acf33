"""Local HTTP servers standing in for Gitea's API and the gateway's admin API.

Each keeps what it was sent, so a test can say what a reviewer or the gateway would see.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl

from tests.conftest import serve_on_loopback

# What a handler answers: status and JSON body, and optionally response headers.
Answer = tuple[int, Any] | tuple[int, Any, dict[str, str]]


@dataclass
class FakeGitea:
    owner: str = "team"
    repo: str = "models"
    token: str = "gitea-token"
    login: str = "gitea-actions"  # the token's user, as Gitea Actions' job token is
    user_forbidden: bool = False  # GET /api/v1/user answers 403, as without read:user
    max_limit: int = 50  # Gitea's MAX_RESPONSE_ITEMS: `limit` above it is cut to it
    paginate: bool = True  # False: an old server that answers every page with all comments
    comments: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    url: str = ""
    next_id: int = 100

    def handle(self, method: str, path: str, auth: str | None, body: Any, query: Mapping[str, str]) -> Answer:
        self.requests.append((method, path))
        if auth != f"token {self.token}":
            return 401, {"message": "token is required"}
        if path == "/api/v1/user" and method == "GET":
            if self.user_forbidden:
                return 403, {"message": "token does not have at least one of required scope(s)"}
            return 200, {"id": 1, "login": self.login}
        prefix = f"/api/v1/repos/{self.owner}/{self.repo}/issues/"
        if not path.startswith(prefix):
            return 404, {"message": "repository not found"}
        rest = path[len(prefix) :].split("/")
        if len(rest) == 2 and rest[1] == "comments" and rest[0].isdigit():
            thread = self.comments.setdefault(int(rest[0]), [])
            if method == "GET":
                return self._page(thread, query)
            if method == "POST":
                self.next_id += 1
                comment = {
                    "id": self.next_id,
                    "body": body["body"],
                    "user": {"login": self.login},
                    "html_url": f"{self.url}/{self.owner}/{self.repo}/pulls/{rest[0]}"
                    f"#issuecomment-{self.next_id}",
                }
                thread.append(comment)
                return 201, comment
        if len(rest) == 2 and rest[0] == "comments" and rest[1].isdigit() and method == "PATCH":
            for thread in self.comments.values():
                for comment in thread:
                    if comment["id"] == int(rest[1]):
                        comment["body"] = body["body"]
                        return 200, comment
            return 404, {"message": "comment not found"}
        return 404, {"message": "not found"}

    def _page(self, thread: list[dict[str, Any]], query: Mapping[str, str]) -> Answer:
        if not self.paginate:
            return 200, thread
        page = max(1, int(query.get("page", "1")))
        limit = min(self.max_limit, max(1, int(query.get("limit", str(self.max_limit)))))
        start = (page - 1) * limit
        return 200, thread[start : start + limit], {"X-Total-Count": str(len(thread))}


@dataclass
class FakeGateway:
    token: str = "admin-token"
    plan: dict[str, Any] | None = None
    refuse_with: str | None = None  # a refusal message: POST /admin/plan answers 422
    posts: list[dict[str, Any]] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    url: str = ""

    def handle(self, method: str, path: str, auth: str | None, body: Any, query: Mapping[str, str]) -> Answer:
        self.requests.append((method, path))
        if auth != f"Bearer {self.token}":
            return 401, {"title": "401 Unauthorized"}
        if path != "/admin/plan":
            return 404, {"title": "404 Not Found"}
        if method == "GET":
            # A real gateway always has a plan; None stands for a URL that reaches no gateway.
            return (200, self.plan) if self.plan is not None else (404, {"title": "404 Not Found"})
        if method == "POST":
            self.posts.append(body)
            if self.refuse_with:
                return 422, {"title": "plan refused", "description": self.refuse_with}
            self.plan = body
            return 200, {"digest": body.get("digest")}
        return 405, {"title": "405 Method Not Allowed"}


@contextmanager
def serve(app: FakeGitea | FakeGateway) -> Iterator[FakeGitea | FakeGateway]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            path, _, raw_query = self.path.partition("?")
            query = dict(parse_qsl(raw_query))
            status, doc, *extra = app.handle(
                self.command, path, self.headers.get("Authorization"), body, query
            )
            data = json.dumps(doc).encode()
            self.send_response(status)
            for name, value in (extra[0] if extra else {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = _answer

        def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
            pass

    with serve_on_loopback(Handler) as app.url:
        yield app
