"""On-demand profiles in the compiler: where they are placed, what the plan says of them,
and how a pull request's diff shows each node's memory."""

from __future__ import annotations

from llmgw.compiler.build import build_plan
from llmgw.compiler.lint import lint
from llmgw.gitops.diff import diff_plans
from llmgw.gitops.report.diff_markdown import diff_markdown
from llmgw.gitops.report.diff_text import diff_lines
from llmgw.plan import dump_plan, parse_plan
from tests.conftest import write_catalog

ONE_NODE = """\
nodes:
  - name: box
    address: 127.0.0.40
    memory_gb: 10
    engines: [llamacpp]
    agent_port: 9200
"""


def model(name: str, gb: float, start: str | None = "on-demand", extra: str = "") -> str:
    start_line = f"    start: {start}\n" if start else ""
    return (
        f"name: {name}\n"
        f"source: hf://org/{name}/{name}.gguf\n"
        "weights_bytes: 1000000000\n"
        "context_length: 2048\n"
        "profiles:\n"
        "  - name: cpu\n"
        "    engine: llamacpp\n"
        f"    min_memory_gb: {gb}\n"
        f"{start_line}{extra}"
    )


def lint_of(tmp_path, models, fleet=ONE_NODE, previous=None, **kwargs):
    catalog, fleet_path = write_catalog(tmp_path, models, fleet)
    return lint(catalog, fleet_path, previous=previous, **kwargs)


def plan_of(tmp_path, models, fleet=ONE_NODE, previous=None):
    result = lint_of(tmp_path, models, fleet, previous)
    assert result.counts()[0] == 0, result.findings
    return parse_plan(dump_plan(build_plan(result, previous=previous)))


def test_on_demand_replicas_that_together_overfill_a_node_are_all_placed(tmp_path):
    # 3 x 4 GB on demand on a 10 GB node beside 5 GB always on: each fits beside the
    # always-on one, which is all an agent that makes room by stopping idle ones needs.
    plan = plan_of(
        tmp_path, {"a.yaml": model("a", 4), "b.yaml": model("b", 4), "c.yaml": model("c", 4),
                   "base.yaml": model("base", 5, start=None)},
    )
    placed = {m.name: len(m.profiles[0].replicas) for m in plan.models}
    assert placed == {"a": 1, "b": 1, "base": 1, "c": 1}
    node = plan.nodes[0]
    assert node.used.memory_gb == 5  # always-on only
    assert node.on_demand is not None
    assert (node.on_demand.replicas, node.on_demand.memory_gb, node.on_demand.largest_gb) == (3, 12, 4)
    assert node.agent == "http://127.0.0.40:9200"
    ports = sorted(r.port for m in plan.models for p in m.profiles for r in p.replicas)
    assert len(set(ports)) == 4, "each replica, on demand or not, needs a port of its own"


def test_the_plan_marks_on_demand_profiles_with_their_idle_time(tmp_path):
    plan = plan_of(tmp_path, {"a.yaml": model("a", 4, extra="    idle_stop: 90s\n"),
                              "b.yaml": model("b", 4), "base.yaml": model("base", 1, start=None)})
    profiles = {m.name: m.profiles[0] for m in plan.models}
    assert (profiles["a"].start, profiles["a"].idle_stop_s) == ("on-demand", 90)
    assert profiles["b"].idle_stop_s == 600, "the default idle time is 10 minutes"
    assert profiles["base"].start is None and profiles["base"].idle_stop_s is None
    doc = plan.doc
    base = next(m for m in doc["models"] if m["name"] == "base")["profiles"][0]
    assert "start" not in base and "idle_stop_s" not in base, "an always-on profile gains no keys"


def test_a_plan_without_on_demand_profiles_has_no_new_keys(tmp_path):
    unnamed = ONE_NODE.replace("    agent_port: 9200\n", "")
    plan = plan_of(tmp_path, {"base.yaml": model("base", 5, start=None)}, fleet=unnamed)
    node = plan.doc["nodes"][0]
    assert "on_demand" not in node and "agent" not in node


def test_a_node_whose_fleet_entry_names_its_agent_port_has_its_agent_in_the_plan(tmp_path):
    """Where the gateway asks for its engines' credentials, on-demand replicas or not."""
    plan = plan_of(tmp_path, {"base.yaml": model("base", 5, start=None)})
    node = plan.doc["nodes"][0]
    assert "on_demand" not in node and node["agent"] == "http://127.0.0.40:9200"


def test_an_on_demand_replica_must_fit_beside_the_always_on_ones(tmp_path):
    result = lint_of(tmp_path, {"a.yaml": model("a", 6), "base.yaml": model("base", 5, start=None)})
    placement = [f for f in result.findings if f.rule == "placement"]
    assert len(placement) == 1 and placement[0].file.endswith("a.yaml")
    assert "must fit beside its node's always-on replicas" in placement[0].message
    assert "box has 5 GB free, held by base (5 GB)" in placement[0].message


def test_an_on_demand_replica_kept_from_the_previous_plan_is_checked_against_new_always_on_ones(tmp_path):
    # `a` sat on the node alone; a pull request adds an always-on model that leaves too
    # little beside it. Keeping `a` where it was, checked before the newcomer took its room,
    # would promise an engine that can never start.
    old = plan_of(tmp_path / "old", {"a.yaml": model("a", 4)})
    result = lint_of(
        tmp_path / "new", {"a.yaml": model("a", 4), "z.yaml": model("z", 7, start=None)}, previous=old
    )
    short = [f for f in result.findings if f.rule == "placement"]
    assert len(short) == 1 and "needing 4 GB (an on-demand replica" in short[0].message


def test_kubernetes_target_refuses_an_on_demand_profile_with_a_sentence(tmp_path):
    result = lint_of(tmp_path, {"a.yaml": model("a", 4)}, kubernetes=True)
    refused = [f for f in result.findings if f.rule == "on-demand"]
    assert refused and refused[0].severity == "error"
    assert "--target kubernetes does not support" in refused[0].message
    assert (refused[0].line, refused[0].column) == (9, 12), "it points at the `start` value"


def test_on_demand_with_external_endpoints_is_an_error_and_idle_stop_alone_a_warning(tmp_path):
    external = (
        "name: ext\nsource: hf://org/ext\ncontext_length: 2048\nprofiles:\n"
        "  - name: far\n    engine: vllm\n    endpoints: [\"http://127.0.0.50:8000\"]\n"
        "    start: on-demand\n"
    )
    result = lint_of(tmp_path, {"ext.yaml": external,
                                "b.yaml": model("b", 1, start=None, extra="    idle_stop: 5m\n")})
    found = {(f.file.rsplit("/", 1)[-1], f.severity) for f in result.findings if f.rule == "on-demand"}
    assert found == {("ext.yaml", "error"), ("b.yaml", "warning")}


def test_the_diff_shows_each_nodes_memory_always_on_and_on_demand_apart(tmp_path):
    old = plan_of(tmp_path / "old", {"base.yaml": model("base", 5, start=None), "a.yaml": model("a", 4)})
    new = plan_of(
        tmp_path / "new",
        {"base.yaml": model("base", 6, start=None), "a.yaml": model("a", 4), "b.yaml": model("b", 3.5)},
        previous=old,
    )
    diff = diff_plans(old, new)
    lines = diff_lines(diff)
    assert "    box: always-on 5 → 6 GB of 10; on demand: 1 → 2 replicas, the largest 4 GB" in lines
    assert "+ model b (chat, 1 replica, on demand)" in lines
    assert "box: always-on 5 → 6 GB of 10" in diff_markdown(diff), "the pull-request comment shows it"


def test_the_diff_shows_no_memory_line_for_a_node_that_did_not_change(tmp_path):
    models = {"base.yaml": model("base", 5, start=None), "a.yaml": model("a", 4)}
    old = plan_of(tmp_path / "old", models)
    models["a.yaml"] = models["a.yaml"].replace("context_length: 2048", "context_length: 1024")
    new = plan_of(tmp_path / "new", models, previous=old)
    assert diff_plans(old, new).memory == ()


def test_more_on_demand_replicas_of_one_profile_than_a_node_holds_at_once_are_a_warning(tmp_path):
    # 9 x 4 GB on demand on a 10 GB node beside 5 GB always on: the node holds one at a time,
    # so eight of them could only ever start by stopping the ninth.
    models = {"a.yaml": model("a", 4, extra="    replicas: 9\n"), "base.yaml": model("base", 5, start=None)}
    result = lint_of(tmp_path, models)
    [warning] = [f for f in result.findings if f.rule == "on-demand"]
    assert warning.severity == "warning" and warning.file.endswith("a.yaml"), result.findings
    said = "9 on-demand replicas of profile cpu are placed on box, which holds 1 of them at once"
    assert said in warning.message
    assert "each needs 4 GB, and 5 GB is left" in warning.message


def test_on_demand_replicas_that_fit_together_say_nothing(tmp_path):
    result = lint_of(tmp_path, {"a.yaml": model("a", 4, extra="    replicas: 2\n")})
    assert not [f for f in result.findings if f.rule == "on-demand"], result.findings


def test_the_diff_says_what_the_author_wrote_in_the_authors_units(tmp_path):
    # The file says `start: on-demand` and `idle_stop: 5m`; the plan keeps seconds, the
    # reviewer reads the file's words, and the default `always` rather than "(none)".
    old = plan_of(tmp_path / "old", {"a.yaml": model("a", 4, start=None)})
    new = plan_of(tmp_path / "new", {"a.yaml": model("a", 4.5, extra="    idle_stop: 5m\n")}, previous=old)
    diff = diff_plans(old, new)
    lines = diff_lines(diff)
    assert "    profile cpu start: always → on-demand" in lines, lines
    assert "    profile cpu idle_stop: (none) → 5m" in lines, lines
    assert "    profile cpu memory_gb: 4 GB → 4.5 GB" in lines, lines
    comment = diff_markdown(diff)
    assert "profile cpu idle_stop (none) → 5m" in comment and "idle_stop_s" not in comment, comment
