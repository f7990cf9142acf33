"""`llmgw render kubernetes`: manifests Kubernetes accepts, from the plan alone, the same bytes
for the same plan, and command lines from the one function the node agent uses too."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
from kubernetes_validate.utils import all_versions, major_minor
from ruamel.yaml import YAML

from llmgw.engines import engine_command
from llmgw.plan import assemble_plan, dump_plan, read_plan
from llmgw.render.kubernetes import Options, RedisSecret, WeightsVolume, render
from tests.conftest import run_llmgw

# The two newest minor versions kubernetes-validate has schemas for.
MINORS = sorted({major_minor(v) for v in all_versions()}, key=lambda v: tuple(map(int, v.split("."))))[-2:]


@pytest.fixture(scope="module")
def k8s_plan(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    run = run_llmgw("plan", "--target", "kubernetes", "--out", out)
    assert run.code == 0, run
    return out


@pytest.fixture(scope="module")
def rendered(k8s_plan, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("manifests")
    run = run_llmgw("render", "kubernetes", k8s_plan, "--out", out)
    assert run.code == 0, run
    return out


def _documents(folder: Path) -> list[dict]:
    yaml = YAML(typ="safe")
    docs = []
    for path in sorted(folder.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.load_all(path.read_text()) if d]
    return docs


def _objects(folder: Path, kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in _documents(folder) if d["kind"] == kind}


@pytest.mark.parametrize("version", MINORS)
def test_every_manifest_validates_against_the_kubernetes_schema(rendered, version):
    assert len(MINORS) == 2
    problems = []
    for doc in _documents(rendered):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message}")
    assert problems == []


def test_each_profile_is_a_deployment_a_headless_service_and_a_budget(rendered, k8s_plan):
    plan = read_plan(k8s_plan)
    workloads = {p.workload.name: p for m in plan.models for p in m.profiles if p.workload}
    deployments = _objects(rendered, "Deployment")
    services = _objects(rendered, "Service")
    budgets = _objects(rendered, "PodDisruptionBudget")
    assert set(workloads) | {"llmgw-gateway"} == set(deployments) == set(services) == set(budgets)
    for name, profile in workloads.items():
        assert deployments[name]["spec"]["replicas"] == profile.workload.replicas
        assert services[name]["spec"]["clusterIP"] == "None", "headless: DNS lists every pod"
        assert services[name]["spec"]["ports"][0]["port"] == plan.target.port


def test_the_engine_command_is_the_node_agents_function_on_all_addresses(rendered, k8s_plan):
    plan = read_plan(k8s_plan)
    model = next(m for m in plan.models if m.name == "llama-3.1-8b")
    profile = model.profiles[0]
    expected = engine_command(
        model, profile, profile.replicas[0],
        weights="/weights/llama-3-1-8b-cpu/" + model.source.split("/", 4)[-1],
        host="0.0.0.0", port=8080, executable="/app/llama-server",
    )
    pod = _objects(rendered, "Deployment")["llama-3-1-8b-cpu"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == list(expected.argv)


def test_memory_gpus_selector_spread_and_probes_come_from_the_plan(rendered, k8s_plan):
    plan = read_plan(k8s_plan)
    gpu = next(p for m in plan.models for p in m.profiles if p.workload and p.gpus)
    pod = _objects(rendered, "Deployment")[gpu.workload.name]["spec"]["template"]["spec"]
    engine = pod["containers"][0]
    assert engine["resources"]["limits"] == {"memory": f"{gpu.memory.gb:g}G", "nvidia.com/gpu": gpu.gpus}
    assert engine["resources"]["requests"] == engine["resources"]["limits"]
    assert "CUDA_VISIBLE_DEVICES" not in str(engine.get("env")), "the device plugin chooses the cards"
    assert pod["nodeSelector"] == gpu.node_selector
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert engine["readinessProbe"]["httpGet"]["path"] == "/health"
    startup = engine["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60, "a large model loads slowly"
    assert pod["initContainers"][0]["command"][:2] == ["llmgw", "fetch"]


def test_the_gateway_runs_twice_or_more_with_the_plan_in_a_configmap(rendered, k8s_plan):
    gateway = _objects(rendered, "Deployment")["llmgw-gateway"]
    assert gateway["spec"]["replicas"] >= 2
    config = _objects(rendered, "ConfigMap")["llmgw-plan"]
    assert config["data"]["plan.json"] == k8s_plan.read_text(), "the plan's own bytes, digest and all"
    labels = gateway["metadata"]["labels"]
    assert labels["app.kubernetes.io/part-of"] == "llmgw"
    assert labels["app.kubernetes.io/component"] == "gateway"


def test_kustomization_lists_every_file_in_the_folder(rendered):
    kustomization = YAML(typ="safe").load((rendered / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in rendered.glob("*.yaml") if p.name != "kustomization.yaml"
    )
    assert kustomization["namespace"] == "llmgw"


def test_the_same_plan_renders_the_same_bytes(rendered, k8s_plan, tmp_path):
    again = tmp_path / "again"
    assert run_llmgw("render", "kubernetes", k8s_plan, "--out", again).code == 0
    first = {p.name: p.read_bytes() for p in rendered.iterdir()}
    assert first == {p.name: p.read_bytes() for p in again.iterdir()}


def test_images_are_overridden_per_engine(k8s_plan, tmp_path):
    run = run_llmgw("render", "kubernetes", k8s_plan, "--out", "-",
                    "--image", "llamacpp=registry.local/llama:1", "--image", "vllm=registry.local/vllm:2")
    assert run.code == 0, run
    images = {d["spec"]["template"]["spec"]["containers"][0]["image"]
              for d in YAML(typ="safe").load_all(run.stdout) if d and d["kind"] == "Deployment"}
    assert images - {"llmgw:0.1.0"} == {"registry.local/llama:1", "registry.local/vllm:2"}


def test_an_unknown_engine_in_image_is_refused_with_a_sentence(k8s_plan):
    run = run_llmgw("render", "kubernetes", k8s_plan, "--out", "-", "--image", "ollama=x")
    assert run.code == 2 and "ENGINE=VALUE" in run.stderr, run


def test_a_plan_for_the_node_agents_is_refused_saying_what_to_run(tmp_path):
    plan = tmp_path / "plan.json"
    assert run_llmgw("plan", "--out", plan).code == 0
    run = run_llmgw("render", "kubernetes", plan, "--out", "-")
    assert run.code == 2 and "llmgw plan --target kubernetes" in run.stderr, run


def test_a_model_dropped_from_the_plan_leaves_the_folder(k8s_plan, tmp_path):
    out = tmp_path / "out"
    assert run_llmgw("render", "kubernetes", k8s_plan, "--out", out).code == 0
    (out / "engine-gone-cpu.yaml").write_text("# Written by `llmgw render kubernetes` (llmgw 0.0.1)\n")
    (out / "engine-mine.yaml").write_text("# someone else's file\n")
    assert run_llmgw("render", "kubernetes", k8s_plan, "--out", out).code == 0
    assert not (out / "engine-gone-cpu.yaml").exists()
    assert (out / "engine-mine.yaml").exists(), "only files the renderer wrote are removed"


def test_weights_volume_kinds(k8s_plan):
    plan = read_plan(k8s_plan)

    def volume(kind: str) -> tuple[dict, dict]:
        files = render(plan, Options(weights=WeightsVolume.parse(kind)))
        doc = next(YAML(typ="safe").load_all(files["engine-llama-3-1-8b-cpu.yaml"]))
        pod = doc["spec"]["template"]["spec"]
        return pod["volumes"][0], pod["containers"][0]["volumeMounts"][0]

    assert volume("emptyDir")[0] == {"name": "weights", "emptyDir": {}}
    claim, mount = volume("pvc:model-weights")
    assert claim["persistentVolumeClaim"] == {"claimName": "model-weights"}
    assert mount["subPath"] == "llama-3-1-8b-cpu", "one claim, a folder per workload"
    host, _ = volume("hostPath:/var/lib/llmgw")
    assert host["hostPath"]["path"] == "/var/lib/llmgw/llama-3-1-8b-cpu"
    with pytest.raises(Exception, match="emptyDir, pvc:CLAIM or hostPath"):
        WeightsVolume.parse("nfs:server")


def test_a_local_weights_path_is_refused_since_no_pod_can_read_it(k8s_plan):
    plan = read_plan(k8s_plan)
    local = [m.model_copy(update={"source": "./weights/model.gguf"}) for m in plan.models]
    with pytest.raises(Exception, match="hf:// or https://"):
        render(assemble_plan(local, plan.nodes, inputs=plan.inputs, target=plan.target), Options())


def test_fewer_than_two_gateways_is_refused(k8s_plan):
    run = run_llmgw("render", "kubernetes", k8s_plan, "--out", "-", "--gateway-replicas", "1")
    assert run.code == 2 and "at least 2" in run.stderr, run


def _kubernetes_expands(text: str, env: dict[str, str]) -> str:
    """What the kubelet makes of a command argument (k8s.io/kubernetes third_party expansion):
    `$$` is one `$`, `$(NAME)` is NAME's value when the container has it, the rest stays."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            close = text.find(")", i + 2)
            if nxt == "(" and close >= 0:
                name = text[i + 2 : close]
                out.append(env.get(name, f"$({name})"))
                i = close + 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


def _with(plan, **update):
    models = [plan.models[0].model_copy(update=update), *plan.models[1:]]
    return assemble_plan(models, plan.nodes, inputs=plan.inputs, target=plan.target)


@pytest.mark.parametrize(
    "source",
    [
        "https://example.com/$(HF_TOKEN)/m.gguf",
        "https://example.com/$$(HF_TOKEN)/m.gguf",  # doubling only `$(` would let this expand
        "https://example.com/a$/m.gguf",
    ],
)
def test_a_source_reaches_the_containers_as_written_never_expanded(k8s_plan, source):
    plan = _with(read_plan(k8s_plan), source=source)
    model = plan.models[0]
    name = f"engine-{model.profiles[0].workload.name}.yaml"
    pod = next(YAML(typ="safe").load_all(render(plan, Options())[name]))["spec"]["template"]["spec"]
    secret = {"HF_TOKEN": "hf_secret"}
    fetch = [_kubernetes_expands(a, secret) for a in pod["initContainers"][0]["command"]]
    assert fetch[2] == source, "Kubernetes would put the hub token in the URL"
    engine = [_kubernetes_expands(a, secret) for a in pod["containers"][0]["command"]]
    assert not any("hf_secret" in a for a in engine)


@pytest.mark.parametrize("odd", ["\u2028", "\u2029", "\x85", "\ufeff", "\x7f", "a\u2028\n b  "])
def test_the_plan_in_the_configmap_reads_back_byte_for_byte_whatever_descriptions_hold(k8s_plan, odd):
    plan = _with(read_plan(k8s_plan), description=f"line one{odd}line two")
    text = render(plan, Options())["gateway.yaml"]
    config = next(d for d in YAML(typ="safe").load_all(text) if d["kind"] == "ConfigMap")
    assert config["data"]["plan.json"] == dump_plan(plan.doc), "the gateway would refuse this plan"


def test_a_plain_plan_stays_a_block_a_reviewer_can_read(rendered):
    assert "plan.json: |" in (rendered / "gateway.yaml").read_text()


def test_the_namespace_is_rendered_and_comes_first_in_the_stream(rendered, k8s_plan):
    (namespace,) = _objects(rendered, "Namespace").values()
    assert namespace["metadata"]["name"] == "llmgw"
    run = run_llmgw("render", "kubernetes", k8s_plan, "--out", "-")
    first = next(d for d in YAML(typ="safe").load_all(run.stdout) if d)
    assert first["kind"] == "Namespace", "kubectl apply creates objects in the order given"


def test_two_profiles_with_one_workload_name_are_refused_not_one_lost(k8s_plan):
    plan = read_plan(k8s_plan)
    twin = plan.models[1].profiles[0].workload
    profile = plan.models[0].profiles[0].model_copy(update={"workload": twin})
    with pytest.raises(Exception, match="would not be deployed"):
        render(_with(plan, profiles=(profile, *plan.models[0].profiles[1:])), Options())


@pytest.mark.parametrize("version", MINORS)
def test_the_redis_url_comes_from_a_secret_and_never_into_a_manifest(k8s_plan, tmp_path, version):
    out = tmp_path / "out"
    run = run_llmgw("render", "kubernetes", k8s_plan, "--out", out, "--redis-secret", "llmgw-redis:redis-url")
    assert run.code == 0, run
    gateway = _objects(out, "Deployment")["llmgw-gateway"]
    kubernetes_validate.validate(gateway, version, strict=True)
    env = gateway["spec"]["template"]["spec"]["containers"][0]["env"]
    reference = {"secretKeyRef": {"name": "llmgw-redis", "key": "redis-url"}}
    assert env == [{"name": "LLMGW_REDIS_URL", "valueFrom": reference}]
    assert "redis://" not in "".join(p.read_text() for p in out.iterdir())


def test_the_redis_secrets_key_defaults_to_url_and_a_url_is_refused_in_its_place(k8s_plan):
    assert render(read_plan(k8s_plan), Options()).keys()  # without it, no env at all
    assert RedisSecret.parse("llmgw-redis") == RedisSecret("llmgw-redis", "url")
    run = run_llmgw("render", "kubernetes", k8s_plan, "--out", "-", "--redis-secret", "redis://:pw@redis:6379")
    assert run.code == 2 and "NAME[:KEY]" in run.stderr and "pw" not in run.stderr, run
