"""Engines as a registry: each engine's module says its command line, slots, memory rule,
image and probe, and a new engine is one more module (here, one registered in the test)."""

from __future__ import annotations

import pytest

from llmgw import engines
from llmgw.compiler.build import KubernetesTarget, build_plan
from llmgw.compiler.lint import lint
from llmgw.compiler.memory import memory_for
from llmgw.engines import Engine, EngineCommand, ctx_size_for, engine, engine_command, gpus_for
from llmgw.errors import UsageError
from llmgw.model import ModelSpec
from llmgw.plan import Plan, PlanModel, PlanProfile, PlanReplica
from llmgw.render.kubernetes import DEFAULT_EXECUTABLES, DEFAULT_IMAGES, Options, render
from tests.conftest import write_catalog
from tests.unit.helpers import model_yaml


class Toy(Engine):
    name = "toy"
    program = "toy-server"
    environ_key = "LLMGW_TOY"
    install_hint = "toy-server is not installed."
    reads = frozenset({"gguf"})
    needs_gpu = True
    image = "example.test/toy:1"
    image_program = "/toy-server"
    health_path = "/ready"

    def command(
        self,
        model: PlanModel,
        profile: PlanProfile,
        replica: PlanReplica,
        *,
        weights: str,
        host: str,
        port: int,
        exe: str,
    ) -> EngineCommand:
        return EngineCommand((exe, weights, f"{host}:{port}", "--name", profile.served_name))

    def slots(self, args: tuple[str, ...]) -> int:
        return 7


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Toy:
    monkeypatch.setattr(engines, "_found", {})  # registered for this test only
    found = Toy()
    engines.register(found)
    return found


def _plan_served_by(tmp_path, name: str, target: KubernetesTarget | None = None) -> Plan:
    """A plan of one model compiled as usual, then handed to engine `name` (which the schema
    would not yet take in a catalogue)."""
    models = {"a.yaml": model_yaml("a", profile_extra="    args: [--fast]\n")}
    doc = build_plan(lint(*write_catalog(tmp_path, models)), target=target)
    for model in doc["models"]:
        for profile in model["profiles"]:
            profile["engine"] = name
    return Plan.of(doc)


def test_a_toy_engine_registered_in_a_test_runs_through_the_command_line_builder(tmp_path, toy: Toy) -> None:
    [model] = _plan_served_by(tmp_path, "toy").models
    [profile] = model.profiles
    replica = profile.replicas[0]
    command = engine_command(model, profile, replica, weights="/w/a.gguf", host="127.0.0.1", port=9)
    assert command.argv == ("toy-server", "/w/a.gguf", "127.0.0.1:9", "--name", "a", "--fast"), (
        "the engine's own line, then the profile's args, as for every engine"
    )
    assert engine("toy").slots(profile.args) == 7


def test_a_toy_engine_gets_its_image_and_probe_in_the_manifests(tmp_path, toy: Toy) -> None:
    plan = _plan_served_by(tmp_path, "toy", KubernetesTarget())
    options = Options(images={"toy": toy.image}, executables={"toy": toy.image_program})
    text = next(t for n, t in render(plan, options).items() if n.startswith("engine-"))
    assert "image: example.test/toy:1" in text
    assert "path: /ready" in text, "the probe is where the engine says it answers"
    assert "- /toy-server" in text


def test_a_toy_engine_is_asked_for_its_gpus_context_and_memory(toy: Toy) -> None:
    profiles = [{"name": "p", "engine": "toy"}]
    fields = {"name": "a", "source": "/w/a", "context_length": 4096}
    spec = ModelSpec.model_validate({**fields, "profiles": profiles})
    [profile] = spec.profiles
    assert gpus_for(profile) == 1, "an engine that needs a GPU asks for one unless told"
    assert ctx_size_for(spec, profile) == 4096
    memory = memory_for(spec, profile, 4_000_000_000)
    assert memory is not None and memory.gb == 6.0, "an engine without a rule of its own gets the rough one"


def test_an_unknown_engine_is_refused_with_the_known_ones_named() -> None:
    with pytest.raises(UsageError, match=r"engine 'sglang' is not one this llmgw knows \(llamacpp, vllm\)"):
        engine("sglang")


@pytest.mark.parametrize(
    ("name", "args", "slots"),
    [
        ("llamacpp", (), 4),
        ("llamacpp", ("--parallel", "2"), 2),
        ("llamacpp", ("-np=3",), 3),
        ("vllm", (), 256),
        ("vllm", ("--max-num-seqs", "8"), 8),
    ],
)
def test_slots_are_what_the_engine_runs_at_once(name: str, args: tuple[str, ...], slots: int) -> None:
    assert engine(name).slots(args) == slots


def test_the_renderer_takes_images_and_probes_from_the_engines() -> None:
    assert DEFAULT_IMAGES == {
        "llamacpp": "ghcr.io/ggml-org/llama.cpp:server",
        "llamacpp-gpu": "ghcr.io/ggml-org/llama.cpp:server-cuda",
        "vllm": "docker.io/vllm/vllm-openai:v0.6.6",
    }
    assert DEFAULT_EXECUTABLES == {"llamacpp": "/app/llama-server", "vllm": "vllm"}
