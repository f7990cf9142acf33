"""Post, or update in place, llmgw's one comment on a Gitea pull request.

Gitea renders no annotations, and older Gitea no job summaries, so this comment is what a
reviewer reads. It is found again by a marker on its first line and by its author, the
token's own user: every push to the pull request updates the same comment instead of adding
another one under it, and a reviewer's comment that happens to start with the marker is
never touched (a token that may write the pull request may edit anyone's comment on it).

Everything comes from the environment Gitea Actions gives a job, so the workflow step is
one line; errors are sentences (GiteaError) naming the variable or the HTTP answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from llmgw.errors import LlmgwError

DEFAULT_MARKER = "<!-- llmgw:pull-request-comment -->"
# Gitea stores comment bodies as TEXT, but a comment this long is unreadable anyway and
# some proxies in front of Gitea refuse large request bodies.
MAX_BODY_CHARS = 60_000
TIMEOUT_SECONDS = 30.0
# Gitea's default cap on a page (MAX_RESPONSE_ITEMS); a long thread spans several pages.
PAGE_LIMIT = 50
# Enough for any real thread, and an end to paging a server that answers every page alike.
MAX_PAGES = 200
# The user Gitea Actions' job token (GITHUB_TOKEN) acts as, and so the author of the
# comments it posts; assumed when the token may not read GET /user.
ACTIONS_LOGIN = "gitea-actions"


class GiteaError(LlmgwError):
    pass


class ReadOnlyFork(GiteaError):
    """Gitea gives a pull request from a fork a read-only token: not the author's fault,
    so the job warns and goes on instead of failing every fork's pull request."""


@dataclass(frozen=True)
class PullRequest:
    server: str  # e.g. http://127.0.0.1:3000, no trailing slash
    owner: str
    repo: str
    number: int
    token: str
    from_fork: bool = False

    @property
    def api(self) -> str:
        return f"{self.server}/api/v1/repos/{self.owner}/{self.repo}"


@dataclass(frozen=True)
class Posted:
    action: Literal["created", "updated", "unchanged"]
    comment_id: int
    url: str | None


def pull_request_from_env(env: Mapping[str, str], number: int | None = None) -> PullRequest:
    """The pull request this job runs for, from the variables Gitea Actions sets."""
    server = (env.get("GITEA_SERVER_URL") or env.get("GITHUB_SERVER_URL") or "").rstrip("/")
    repository = env.get("GITHUB_REPOSITORY") or env.get("GITEA_REPOSITORY") or ""
    token = env.get("GITEA_TOKEN") or env.get("GITHUB_TOKEN") or ""
    missing = [
        name
        for name, value in (
            ("GITHUB_SERVER_URL (or GITEA_SERVER_URL)", server),
            ("GITHUB_REPOSITORY", repository),
            ("GITHUB_TOKEN (or GITEA_TOKEN)", token),
        )
        if not value
    ]
    if missing:
        raise GiteaError(
            f"cannot post the pull-request comment: {', '.join(missing)} not set. Gitea Actions "
            "sets these in every job; outside a job, export them (the token needs write access "
            "to the repository's issues)."
        )
    if "/" not in repository:
        raise GiteaError(f"GITHUB_REPOSITORY is {repository!r}; expected owner/name.")
    owner, repo = repository.split("/", 1)
    event_path = env.get("GITHUB_EVENT_PATH") or env.get("GITEA_EVENT_PATH")
    if number is None:
        number = _number_from_event(event_path)
    return PullRequest(server, owner, repo, number, token, _from_fork(event_path, repository))


def _from_fork(event_path: str | None, repository: str) -> bool:
    try:
        event = json.loads(Path(event_path).read_text(encoding="utf-8")) if event_path else {}
        head = event["pull_request"]["head"]["repo"]["full_name"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return isinstance(head, str) and head.lower() != repository.lower()


def _number_from_event(event_path: str | None) -> int:
    if not event_path:
        raise GiteaError(
            "cannot tell which pull request to comment on: GITHUB_EVENT_PATH is not set. "
            "Run this in a pull_request workflow, or pass --pr NUMBER."
        )
    try:
        event = json.loads(Path(event_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GiteaError(f"cannot read the workflow event {event_path}: {exc}.") from None
    number = (event.get("pull_request") or {}).get("number") or event.get("number")
    if not isinstance(number, int):
        raise GiteaError(
            f"the workflow event {event_path} is not about a pull request (no pull_request.number);"
            " run this step only `on: pull_request`, or pass --pr NUMBER."
        )
    return number


def with_marker(body: str, marker: str = DEFAULT_MARKER) -> str:
    """The body as posted: marker first, cut short with a note if it is too long."""
    if len(body) > MAX_BODY_CHARS:
        body = body[:MAX_BODY_CHARS].rsplit("\n", 1)[0] + (
            "\n\n…cut short: the rest is in the job log and summary of this workflow run.\n"
        )
    return f"{marker}\n{body}"


def post_comment(
    pr: PullRequest,
    body: str,
    marker: str = DEFAULT_MARKER,
    transport: httpx.BaseTransport | None = None,
) -> Posted:
    """Create llmgw's comment on `pr`, or update the one that carries `marker`."""
    text = with_marker(body, marker)
    headers = {"Authorization": f"token {pr.token}", "Accept": "application/json"}
    with httpx.Client(headers=headers, timeout=TIMEOUT_SECONDS, transport=transport) as client:
        me = token_login(client, pr)
        ours = [
            c
            for c in all_comments(client, pr)
            if str(c.get("body", "")).startswith(marker) and _author(c) == me
        ]
        if not ours:
            created = _call(client, "POST", f"{pr.api}/issues/{pr.number}/comments", pr, {"body": text})
            return Posted("created", int(created["id"]), created.get("html_url"))
        # The oldest is kept and updated, so the comment stays where the conversation began.
        existing = min(ours, key=lambda c: int(c["id"]))
        if existing.get("body") == text:
            return Posted("unchanged", int(existing["id"]), existing.get("html_url"))
        updated = _call(client, "PATCH", f"{pr.api}/issues/comments/{existing['id']}", pr, {"body": text})
        return Posted("updated", int(updated["id"]), updated.get("html_url"))


def token_login(client: httpx.Client, pr: PullRequest) -> str:
    """The login of the token's user: only comments by it are ours to update.

    A token without the read:user scope is refused GET /user; the job token of Gitea
    Actions, which the workflow uses, posts as ACTIONS_LOGIN, so that is assumed. Any
    other refusal is left for the comment calls below to explain.
    """
    try:
        response = client.get(f"{pr.server}/api/v1/user")
    except httpx.HTTPError as exc:
        raise GiteaError(f"cannot reach Gitea at {pr.server}: {exc}.") from None
    try:
        login = response.json().get("login") if response.status_code == 200 else None
    except (ValueError, AttributeError):
        login = None
    return login if isinstance(login, str) and login else ACTIONS_LOGIN


def all_comments(client: httpx.Client, pr: PullRequest) -> list[dict[str, Any]]:
    """Every comment on the pull request, page by page.

    Gitea pages this list; reading only the first page missed our comment on a long
    thread and posted a second one. The end is an empty or short page, or X-Total-Count
    when Gitea sends it (a server whose cap is below PAGE_LIMIT sends short pages early);
    a server that ignores `page` and answers the same comments again ends it too.
    """
    url = f"{pr.api}/issues/{pr.number}/comments"
    comments: dict[int, dict[str, Any]] = {}
    for page in range(1, MAX_PAGES + 1):
        response = _request(client, "GET", url, pr, params={"page": page, "limit": PAGE_LIMIT})
        batch = _json(response, "GET", url)
        if not isinstance(batch, list):
            raise GiteaError(f"Gitea at {pr.server} answered the comment list with no list.")
        new = {i: c for c in batch if (i := _id(c)) is not None and i not in comments}
        comments.update(new)
        total = _total_count(response)
        if not new or (total is not None and len(comments) >= total):
            break
        if total is None and len(batch) < PAGE_LIMIT:
            break
    return list(comments.values())


def _total_count(response: httpx.Response) -> int | None:
    try:
        return int(response.headers["X-Total-Count"])
    except (KeyError, ValueError):
        return None


def _id(comment: Any) -> int | None:
    ident = comment.get("id") if isinstance(comment, dict) else None
    return ident if isinstance(ident, int) and not isinstance(ident, bool) else None


def _author(comment: dict[str, Any]) -> str | None:
    user = comment.get("user")
    return user.get("login") if isinstance(user, dict) else None


def _call(client: httpx.Client, method: str, url: str, pr: PullRequest, payload: Any = None) -> Any:
    return _json(_request(client, method, url, pr, payload), method, url)


def _request(
    client: httpx.Client,
    method: str,
    url: str,
    pr: PullRequest,
    payload: Any = None,
    params: dict[str, int] | None = None,
) -> httpx.Response:
    try:
        response = client.request(method, url, json=payload, params=params)
    except httpx.HTTPError as exc:
        raise GiteaError(f"cannot reach Gitea at {pr.server}: {exc}.") from None
    if response.status_code in (401, 403) and pr.from_fork:
        raise ReadOnlyFork(
            f"Gitea refused {method} {url} (HTTP {response.status_code}): this pull request "
            "comes from a fork, whose jobs get a read-only token, so no comment was posted. "
            "The lint findings and the plan diff are in this job's log and summary."
        )
    if response.status_code in (401, 403):
        raise GiteaError(
            f"Gitea refused {method} {url} (HTTP {response.status_code}): the token may not "
            "write to this repository's issues. A pull request from a fork gets a read-only "
            "token; the comment can only be posted for branches of this repository."
        )
    if response.status_code == 404:
        raise GiteaError(
            f"Gitea has no pull request #{pr.number} in {pr.owner}/{pr.repo} at {pr.server} "
            f"({method} {url} answered 404); check GITHUB_REPOSITORY and the event."
        )
    if response.is_error:
        raise GiteaError(
            f"Gitea answered {method} {url} with HTTP {response.status_code}: {_message(response)}."
        )
    return response


def _json(response: httpx.Response, method: str, url: str) -> Any:
    try:
        return response.json()
    except ValueError:
        raise GiteaError(
            f"Gitea answered {method} {url} with something that is not JSON; check that "
            "GITHUB_SERVER_URL is Gitea's root URL, not a login page or a proxy in front of it."
        ) from None


def _message(response: httpx.Response) -> str:
    try:
        doc = response.json()
    except ValueError:
        return response.text.strip()[:200] or "(no body)"
    if isinstance(doc, dict) and doc.get("message"):
        return str(doc["message"])
    return json.dumps(doc)[:200]
