"""The pull-request comment: created once, then updated in place, found again by its marker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmgw.gitops.gitea import DEFAULT_MARKER, GiteaError, post_comment, pull_request_from_env
from tests.conftest import run_llmgw
from tests.gitops.servers import FakeGitea, serve


def gitea_env(gitea: FakeGitea, tmp_path: Path, number: int = 7) -> dict[str, str]:
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"action": "synchronized", "pull_request": {"number": number}}))
    return {
        "GITHUB_SERVER_URL": gitea.url,
        "GITHUB_REPOSITORY": f"{gitea.owner}/{gitea.repo}",
        "GITHUB_TOKEN": gitea.token,
        "GITHUB_EVENT_PATH": str(event),
    }


def post(tmp_path: Path, gitea: Any, body: str, **env: str) -> Any:
    body_file = tmp_path / "comment.md"
    body_file.write_text(body)
    return run_llmgw("pr-comment", "--body-file", body_file, **{**gitea_env(gitea, tmp_path), **env})


def test_first_run_creates_the_comment_and_later_runs_update_it(tmp_path: Path) -> None:
    with serve(FakeGitea()) as gitea:
        first = post(tmp_path, gitea, "### Plan: 1 to add\n")
        assert first.code == 0, first
        assert "Created comment 101 on pull request #7 of team/models" in first.stderr, first
        second = post(tmp_path, gitea, "### Plan: 2 to add\n")
        assert second.code == 0, second
        assert "Updated comment 101" in second.stderr, second
    thread = gitea.comments[7]
    assert len(thread) == 1, "a second push must not add a second comment"
    assert thread[0]["body"] == f"{DEFAULT_MARKER}\n### Plan: 2 to add\n"
    assert ("PATCH", "/api/v1/repos/team/models/issues/comments/101") in gitea.requests


def test_other_peoples_comments_are_left_alone(tmp_path: Path) -> None:
    gitea = FakeGitea()
    gitea.comments[7] = [
        {"id": 5, "body": "LGTM"},
        {"id": 6, "body": f"> {DEFAULT_MARKER}\n> quoted by a reviewer"},
    ]
    with serve(gitea):
        result = post(tmp_path, gitea, "body\n")
    assert result.code == 0, result
    assert [c["body"] for c in gitea.comments[7][:2]] == [
        "LGTM",
        f"> {DEFAULT_MARKER}\n> quoted by a reviewer",
    ]
    assert len(gitea.comments[7]) == 3


def test_an_unchanged_body_is_not_patched(tmp_path: Path) -> None:
    with serve(FakeGitea()) as gitea:
        post(tmp_path, gitea, "same\n")
        again = post(tmp_path, gitea, "same\n")
    assert "Unchanged comment 101" in again.stderr, again
    assert not any(method == "PATCH" for method, _ in gitea.requests)


def test_a_refused_token_is_a_sentence_and_exit_2(tmp_path: Path) -> None:
    with serve(FakeGitea()) as gitea:
        result = post(tmp_path, gitea, "body\n", GITHUB_TOKEN="wrong")
    assert result.code == 2, result
    assert "Traceback" not in result.stderr, result
    assert "HTTP 401" in result.stderr and "read-only" in result.stderr, result


def test_missing_environment_names_each_variable(tmp_path: Path) -> None:
    body = tmp_path / "comment.md"
    body.write_text("body\n")
    result = run_llmgw(
        "pr-comment",
        "--body-file",
        body,
        GITHUB_SERVER_URL="",
        GITEA_SERVER_URL="",
        GITHUB_REPOSITORY="",
        GITHUB_TOKEN="",
        GITEA_TOKEN="",
    )
    assert result.code == 2, result
    for name in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_TOKEN"):
        assert name in result.stderr, result
    assert "Traceback" not in result.stderr, result


def test_an_event_that_is_not_a_pull_request_says_so(tmp_path: Path) -> None:
    event = tmp_path / "push.json"
    event.write_text(json.dumps({"ref": "refs/heads/main"}))
    env = {
        "GITHUB_SERVER_URL": "http://127.0.0.1:9",
        "GITHUB_REPOSITORY": "team/models",
        "GITHUB_TOKEN": "t",
        "GITHUB_EVENT_PATH": str(event),
    }
    with pytest.raises(GiteaError, match="not about a pull request"):
        pull_request_from_env(env)


def test_an_unreachable_gitea_is_a_sentence(tmp_path: Path) -> None:
    env = {
        "GITHUB_SERVER_URL": "http://127.0.0.1:9",
        "GITHUB_REPOSITORY": "team/models",
        "GITHUB_TOKEN": "t",
    }
    with pytest.raises(GiteaError, match="cannot reach Gitea at http://127.0.0.1:9"):
        post_comment(pull_request_from_env(env, number=3), "body")


def test_an_unknown_repository_is_a_404_sentence(tmp_path: Path) -> None:
    with serve(FakeGitea()) as gitea:
        result = post(tmp_path, gitea, "body\n", GITHUB_REPOSITORY="team/other")
    assert result.code == 2, result
    assert "no pull request #7 in team/other" in result.stderr, result


def test_an_empty_body_is_refused_before_calling_gitea(tmp_path: Path) -> None:
    with serve(FakeGitea()) as gitea:
        result = post(tmp_path, gitea, "  \n")
    assert result.code == 2, result
    assert "comment body is empty" in result.stderr, result
    assert gitea.requests == []


def marked(comment_id: int, login: str, text: str = "old\n") -> dict[str, Any]:
    return {"id": comment_id, "body": f"{DEFAULT_MARKER}\n{text}", "user": {"login": login}}


def test_a_reviewers_comment_that_starts_with_the_marker_is_not_ours(tmp_path: Path) -> None:
    # Gitea lets a token that may write the pull request edit anyone's comment on it.
    gitea = FakeGitea(login="llmgw-bot")
    gitea.comments[7] = [marked(5, "alice", "pasted from the bot\n"), marked(6, "llmgw-bot")]
    with serve(gitea):
        result = post(tmp_path, gitea, "new\n")
    assert result.code == 0, result
    assert "Updated comment 6" in result.stderr, result
    assert gitea.comments[7][0]["body"] == f"{DEFAULT_MARKER}\npasted from the bot\n"
    assert ("PATCH", "/api/v1/repos/team/models/issues/comments/5") not in gitea.requests


def test_only_a_reviewers_marked_comment_means_ours_is_created(tmp_path: Path) -> None:
    gitea = FakeGitea(login="llmgw-bot")
    gitea.comments[7] = [marked(5, "alice")]
    with serve(gitea):
        result = post(tmp_path, gitea, "new\n")
    assert "Created comment 101" in result.stderr, result
    assert gitea.comments[7][0] == marked(5, "alice")


def test_a_token_that_may_not_read_its_user_takes_gitea_actions_comments_as_ours(
    tmp_path: Path,
) -> None:
    gitea = FakeGitea(user_forbidden=True)
    gitea.comments[7] = [marked(5, "alice"), marked(6, "gitea-actions")]
    with serve(gitea):
        result = post(tmp_path, gitea, "new\n")
    assert result.code == 0, result
    assert "Updated comment 6" in result.stderr, result
    assert gitea.comments[7][0] == marked(5, "alice")


def others(n: int, first_id: int = 1) -> list[dict[str, Any]]:
    return [{"id": first_id + i, "body": "LGTM", "user": {"login": "alice"}} for i in range(n)]


def test_our_comment_on_a_later_page_is_updated_not_posted_again(tmp_path: Path) -> None:
    gitea = FakeGitea()
    gitea.comments[7] = [*others(120), marked(500, "gitea-actions")]
    with serve(gitea):
        result = post(tmp_path, gitea, "new\n")
    assert "Updated comment 500" in result.stderr, result
    assert len(gitea.comments[7]) == 121, "a long thread must not get a second llmgw comment"


def test_pages_are_read_to_the_end_when_gitea_caps_the_page_below_ours(tmp_path: Path) -> None:
    gitea = FakeGitea(max_limit=30)  # an admin lowered MAX_RESPONSE_ITEMS
    gitea.comments[7] = [*others(40), marked(500, "gitea-actions")]
    with serve(gitea):
        result = post(tmp_path, gitea, "new\n")
    assert "Updated comment 500" in result.stderr, result


def test_a_server_that_ignores_page_is_read_once_more_and_no_further(tmp_path: Path) -> None:
    gitea = FakeGitea(paginate=False)
    gitea.comments[7] = [*others(60), marked(500, "gitea-actions")]
    with serve(gitea):
        result = post(tmp_path, gitea, "new\n")
    assert "Updated comment 500" in result.stderr, result
    lists = [r for r in gitea.requests if r == ("GET", "/api/v1/repos/team/models/issues/7/comments")]
    assert len(lists) == 2, lists


def test_a_fork_pull_request_warns_instead_of_failing_the_job(tmp_path: Path) -> None:
    with serve(FakeGitea()) as gitea:
        env = gitea_env(gitea, tmp_path)
        event = {"pull_request": {"number": 7, "head": {"repo": {"full_name": "someone/models"}},
                                  "base": {"repo": {"full_name": f"{gitea.owner}/{gitea.repo}"}}}}
        Path(env["GITHUB_EVENT_PATH"]).write_text(json.dumps(event))
        body = tmp_path / "comment.md"
        body.write_text("body\n")
        result = run_llmgw("pr-comment", "--body-file", body, **{**env, "GITHUB_TOKEN": "read-only"})
    assert result.code == 0, result
    assert result.stdout.startswith("::warning title=pr-comment::") and "fork" in result.stdout
    assert gitea.comments.get(7, []) == []
