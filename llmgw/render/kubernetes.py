"""A Kubernetes plan → manifests Argo CD or Flux can sync: one file per workload, the
gateway's file, and a kustomization.yaml listing them.

    namespace.yaml     the Namespace every object is in
    engine-NAME.yaml   per (model, profile): Deployment, headless Service, PodDisruptionBudget
    gateway.yaml       the plan as a ConfigMap; the gateway's Deployment, Service and PDB
    kustomization.yaml every file above, and the namespace

The same plan and options always give the same bytes, and an engine's file changes only
when its own model or profile does, so a pull request's diff shows what really changes.
Command lines, probes and images come from each engine's module (llmgw/engines/), as the
node agent's do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.scalarstring import DoubleQuotedScalarString, LiteralScalarString

from llmgw import __version__
from llmgw.atomic import replace_file
from llmgw.engines import engine, engine_command, fetched_weights, names
from llmgw.errors import UsageError
from llmgw.plan import Plan, PlanModel, PlanProfile, Target, dump_plan

# The engine images used unless --image says otherwise, and where each keeps its engine, as
# each engine's module says. A profile that asks for GPUs gets the engine's GPU build where it
# has one of its own (`llamacpp-gpu`, llama.cpp's CUDA build).
DEFAULT_IMAGES = {
    key: image
    for name in names()
    for key, image in ((name, engine(name).image), (f"{name}-gpu", engine(name).gpu_image))
    if image is not None
}
DEFAULT_EXECUTABLES = {name: engine(name).image_program for name in names()}
GATEWAY_NAME = "llmgw-gateway"
GATEWAY_PORT = 8080
WEIGHTS_DIR = "/weights"
PLAN_DIR = "/etc/llmgw"
HEADER = (
    "# Written by `llmgw render kubernetes` (llmgw {version}) from the plan; do not edit.\n"
    "# Change the catalogue, run `llmgw plan --target kubernetes` and render again.\n"
)
# An engine reads its weights before it answers /health: allow an hour (360 × 10 s) for a
# large model from a slow disk. The init container's download comes before and is not counted.
STARTUP_PERIOD_S, STARTUP_FAILURES = 10, 360
# What a block scalar cannot hold as it is, and JSON (so the plan) leaves unescaped: the line
# breaks YAML has and JSON does not (each one splits a line, and the plan read back is not the
# plan), and characters outside YAML's printable set (a reader refuses the whole file).
NOT_IN_A_BLOCK = re.compile(
    "[\x85\u2028\u2029]|[^\x09\x0a\x0d\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"
)


@dataclass(frozen=True)
class WeightsVolume:
    """Where the init container leaves the weights: `emptyDir` (fetched again by every new
    pod), `pvc:CLAIM` or `hostPath:/path` (kept across restarts, shared per workload)."""

    kind: str = "emptyDir"
    value: str = ""

    @classmethod
    def parse(cls, text: str) -> WeightsVolume:
        kind, _, value = text.partition(":")
        if kind == "emptyDir" and not value:
            return cls()
        if kind in ("pvc", "hostPath") and value:
            if kind == "hostPath" and not value.startswith("/"):
                raise UsageError(
                    f"--weights-volume {text!r}: hostPath needs an absolute path, e.g. "
                    "hostPath:/var/lib/llmgw/weights."
                )
            return cls(kind, value)
        raise UsageError(
            f"--weights-volume {text!r} is not emptyDir, pvc:CLAIM or hostPath:/PATH "
            "(for example pvc:model-weights)."
        )

    def source(self) -> dict[str, Any]:
        if self.kind == "pvc":
            return {"persistentVolumeClaim": {"claimName": self.value}}
        if self.kind == "hostPath":
            return {"hostPath": {"path": self.value, "type": "DirectoryOrCreate"}}
        return {"emptyDir": {}}


@dataclass(frozen=True)
class RedisSecret:
    """`--redis-secret NAME[:KEY]`: the Secret (and its key, `url` unless named) holding
    LLMGW_REDIS_URL. A reference, so the password is in the cluster's Secret and never in
    these files, which are meant for a git repository."""

    name: str
    key: str = "url"

    @classmethod
    def parse(cls, text: str) -> RedisSecret:
        name, sep, key = text.partition(":")
        if not _DNS_NAME.fullmatch(name) or (sep and not _SECRET_KEY.fullmatch(key)):
            # Not quoted: what was given may be the URL itself, password and all.
            raise UsageError(
                "--redis-secret is not NAME[:KEY] naming a Secret and its key "
                "(for example --redis-secret llmgw-redis:url); put the URL itself in the Secret, "
                "never on the command line."
            )
        return cls(name, key) if sep else cls(name)

    def env(self) -> dict[str, Any]:
        # Not optional: a missing Secret holds the pod back with an event saying so, where
        # an optional one would start every replica counting limits on its own, silently.
        reference = {"secretKeyRef": {"name": self.name, "key": self.key}}
        return {"name": "LLMGW_REDIS_URL", "valueFrom": reference}


_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")


@dataclass(frozen=True)
class Options:
    images: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_IMAGES))
    executables: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_EXECUTABLES))
    gateway_image: str = f"llmgw:{__version__}"
    gateway_replicas: int = 2
    weights: WeightsVolume = WeightsVolume()
    redis: RedisSecret | None = None  # where every replica counts rate limits together


def parse_pairs(pairs: tuple[str, ...], flag: str, known: Mapping[str, str]) -> dict[str, str]:
    """`--image vllm=IMAGE` and the like, over the defaults; a sentence for a wrong one."""
    out = dict(known)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not value or key not in known:
            raise UsageError(
                f"{flag} {pair!r} is not ENGINE=VALUE for one of {', '.join(sorted(known))} "
                f"(for example {flag} vllm={known.get('vllm', 'VALUE')})."
            )
        out[key] = value
    if flag == "--image":
        # One image given for an engine serves its GPU build too, unless that is given.
        given = {p.partition("=")[0] for p in pairs}
        for key in given:
            if f"{key}-gpu" in known and f"{key}-gpu" not in given:
                out[f"{key}-gpu"] = out[key]
    return out


def render(plan: Plan, options: Options) -> dict[str, str]:
    """File name → text, in the order the stream writes them."""
    target = _target_of(plan)
    engines: dict[str, str] = {}
    owners: dict[str, str] = {}
    for model in plan.models:
        for profile in model.profiles:
            if profile.workload is None:
                continue
            name = f"engine-{profile.workload.name}.yaml"
            owner = f"{model.name}/{profile.name}"
            if name in engines:
                # One file (and one Deployment) would silently stand for two workloads.
                raise UsageError(
                    f"{owner} and {owners[name]} both have the workload name "
                    f"{profile.workload.name}, so one of them would not be deployed; plan "
                    "again with this version of `llmgw plan --target kubernetes`, which gives "
                    "every workload its own name."
                )
            owners[name] = owner
            engines[name] = _file(_engine(model, profile, target, options))
    files = {
        "namespace.yaml": _file([_namespace(target)]),
        "gateway.yaml": _file(_gateway(plan, target, options)),
        **dict(sorted(engines.items())),
    }
    files["kustomization.yaml"] = _file(
        [
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": target.namespace,
                "resources": list(files),
            }
        ]
    )
    return files


def stream(files: Mapping[str, str]) -> str:
    """Every manifest as one multi-document stream, for `kubectl apply -f -`."""
    # The Namespace first: every object after it is created inside it.
    parts = [text.split("\n", 2)[2] for name, text in files.items() if name != "kustomization.yaml"]
    return HEADER.format(version=__version__) + "---\n".join(parts)


def _namespace(target: Target) -> dict[str, Any]:
    # Written out rather than assumed: `kubectl apply` of the stream into a namespace that
    # does not exist fails at the first object.
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": target.namespace, "labels": {"app.kubernetes.io/part-of": "llmgw"}},
    }


def as_written(text: str) -> str:
    """`text` in a container's command or env, where Kubernetes reads `$(NAME)` as the
    variable NAME: a source holding `$(HF_TOKEN)` once sent the hub token to the host its URL
    named. Kubernetes reads `$$` as one `$`, so every `$` is doubled, and the container gets
    the text as the catalogue wrote it."""
    return text.replace("$", "$$")


def plan_scalar(text: str) -> str:
    """The plan as the ConfigMap holds it, so that it reads back byte for byte.

    A block (`|`) is what a person reviewing the manifests can read, and is used whenever it
    reads back the same; otherwise a double-quoted string, where every such character is
    written as an escape.
    """
    style = LiteralScalarString if NOT_IN_A_BLOCK.search(text) is None else DoubleQuotedScalarString
    scalar: str = style(text)
    return scalar


def _target_of(plan: Plan) -> Target:
    if plan.target is None:
        raise UsageError(
            "this plan places replicas on nodes for llmgw's node agents; Kubernetes needs one written "
            "with `llmgw plan --target kubernetes`, which leaves placing to the scheduler."
        )
    return plan.target


def _labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "llmgw",
        "app.kubernetes.io/managed-by": "llmgw",
    }


def _selector(name: str, component: str) -> dict[str, str]:
    # Never the version or anything else that changes: a Deployment's selector is immutable.
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/component": component}


def _meta(name: str, target: Target, component: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": target.namespace, "labels": _labels(name, component), **extra}


def _engine(model: PlanModel, profile: PlanProfile, target: Target, options: Options) -> list[dict[str, Any]]:
    """One workload: its Deployment, its headless Service and its PodDisruptionBudget."""
    assert profile.workload is not None
    name = profile.workload.name
    selector = _selector(name, "engine")
    annotations = {
        "llmgw.dev/model": model.name,
        "llmgw.dev/profile": profile.name,
        "llmgw.dev/source": model.source,
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(name, target, "engine", annotations=annotations),
        "spec": {
            "replicas": profile.workload.replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": selector},
            # The fit check counted the replicas, not a spare one: a rollout replaces a pod
            # at a time rather than waiting for room for an extra one that may never come.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": _labels(name, "engine"), "annotations": annotations},
                "spec": _engine_pod(model, profile, target, options),
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, target, "engine", annotations=annotations),
        "spec": {
            # Headless: its DNS name lists every ready pod, and the gateway routes to each.
            "clusterIP": "None",
            "selector": selector,
            "ports": [{"name": "http", "port": target.port, "targetPort": "http"}],
        },
    }
    return [deployment, service, _budget(name, target, "engine", {"maxUnavailable": 1})]


def _engine_pod(model: PlanModel, profile: PlanProfile, target: Target, options: Options) -> dict[str, Any]:
    """The pod: an init container fetches the weights into a volume the engine reads."""
    assert profile.workload is not None
    name = profile.workload.name
    directory = f"{WEIGHTS_DIR}/{name}"
    fetch = ["llmgw", "fetch", model.source, "--into", directory]
    if model.weights_bytes is not None:
        fetch += ["--bytes", str(model.weights_bytes)]
    pod: dict[str, Any] = {}
    if profile.node_selector:
        pod["nodeSelector"] = dict(profile.node_selector)
    if profile.gpus:
        # GPU nodes are usually tainted so that nothing else lands on them.
        pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    pod["topologySpreadConstraints"] = [
        {
            # As the fit check placed them: on different hosts where there are enough, but a
            # replica doubled up on one host serves better than one left pending.
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": _selector(name, "engine")},
        }
    ]
    pod["initContainers"] = [
        {
            "name": "weights",
            "image": options.gateway_image,
            "command": [as_written(arg) for arg in fetch],
            # HF_TOKEN for gated repositories, when the operator creates the Secret.
            "envFrom": [{"secretRef": {"name": "llmgw-hub", "optional": True}}],
            "volumeMounts": [{"name": "weights", "mountPath": directory}],
        }
    ]
    pod["containers"] = [_engine_container(model, profile, target, options, directory)]
    volume = options.weights.source()
    if options.weights.kind == "hostPath":
        volume = {"hostPath": {**volume["hostPath"], "path": f"{options.weights.value.rstrip('/')}/{name}"}}
    pod["volumes"] = [{"name": "weights", **volume}]
    if options.weights.kind == "pvc":
        # One claim for every workload, a folder each.
        pod["containers"][0]["volumeMounts"][0]["subPath"] = name
        pod["initContainers"][0]["volumeMounts"][0]["subPath"] = name
    return pod


def _engine_container(
    model: PlanModel, profile: PlanProfile, target: Target, options: Options, directory: str
) -> dict[str, Any]:
    """The engine itself, run as the node agent runs it, probed where the engine says."""
    weights = fetched_weights(model.source, directory)
    if weights is None:
        raise UsageError(
            f"model '{model.name}' has the source {model.source}, a path on one machine, which a pod "
            "cannot read; give it an hf:// or https:// source, or serve it with the node agent."
        )
    command = engine_command(
        model,
        profile,
        profile.replicas[0],
        weights=weights,
        host="0.0.0.0",
        port=target.port,
        executable=options.executables[profile.engine],
    )
    # The device plugin decides which cards a container sees; the agent's CUDA_VISIBLE_DEVICES
    # (empty for a replica without GPUs of its own) would hide them all.
    env = [
        {"name": k, "value": as_written(v)}
        for k, v in sorted(command.env.items())
        if k != "CUDA_VISIBLE_DEVICES"
    ]
    gpu_build = f"{profile.engine}-gpu"
    image_key = gpu_build if profile.gpus and gpu_build in options.images else profile.engine
    resources: dict[str, Any] = {}
    if profile.memory is not None:
        memory = f"{profile.memory.gb:g}G"
        resources = {"requests": {"memory": memory}, "limits": {"memory": memory}}
    if profile.gpus:
        for part in ("requests", "limits"):
            resources.setdefault(part, {})["nvidia.com/gpu"] = profile.gpus
    container: dict[str, Any] = {
        "name": "engine",
        "image": options.images[image_key],
        "command": [as_written(arg) for arg in command.argv],
        "ports": [{"name": "http", "containerPort": target.port}],
    }
    if env:
        container["env"] = env
    container["resources"] = resources
    health = engine(profile.engine).health_path
    container["readinessProbe"] = {
        "httpGet": {"path": health, "port": "http"},
        "periodSeconds": 5,
        "failureThreshold": 3,
    }
    container["startupProbe"] = {
        "httpGet": {"path": health, "port": "http"},
        "periodSeconds": STARTUP_PERIOD_S,
        "failureThreshold": STARTUP_FAILURES,
    }
    container["volumeMounts"] = [{"name": "weights", "mountPath": directory, "readOnly": True}]
    return container


def _budget(name: str, target: Target, component: str, rule: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(name, target, component),
        "spec": {**rule, "selector": {"matchLabels": _selector(name, component)}},
    }


def _gateway(plan: Plan, target: Target, options: Options) -> list[dict[str, Any]]:
    if options.gateway_replicas < 2:
        raise UsageError(
            f"--gateway-replicas {options.gateway_replicas}: the gateway is every model's one way in, "
            "so it runs at least 2 replicas; give 2 or more."
        )
    name = GATEWAY_NAME
    selector = _selector(name, "gateway")
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(
            "llmgw-plan", target, "gateway", annotations={"llmgw.dev/plan-digest": plan.digest}
        ),
        # The plan's own bytes: its digest is checked again by every gateway that loads it.
        # Kubernetes updates the mounted file in place, and the gateway reloads it.
        "data": {"plan.json": plan_scalar(dump_plan(plan.doc))},
    }
    container = {
        "name": "gateway",
        "image": options.gateway_image,
        "command": ["llmgw", "serve", "--plan", f"{PLAN_DIR}/plan.json", "--bind", f"0.0.0.0:{GATEWAY_PORT}"],
        # LLMGW_ADMIN_TOKEN, LLMGW_API_KEYS_FILE and the rest, when the operator creates the Secret.
        "envFrom": [{"secretRef": {"name": name, "optional": True}}],
        **({"env": [options.redis.env()]} if options.redis else {}),
        "ports": [{"name": "http", "containerPort": GATEWAY_PORT}],
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "volumeMounts": [{"name": "plan", "mountPath": PLAN_DIR, "readOnly": True}],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(name, target, "gateway"),
        "spec": {
            "replicas": options.gateway_replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": _labels(name, "gateway")},
                "spec": {
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": selector},
                        }
                    ],
                    # Streams in flight get this long to finish when a pod is replaced.
                    "terminationGracePeriodSeconds": 60,
                    "containers": [container],
                    "volumes": [{"name": "plan", "configMap": {"name": "llmgw-plan"}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, target, "gateway"),
        "spec": {"selector": selector, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }
    return [config, deployment, service, _budget(name, target, "gateway", {"minAvailable": 1})]


def _file(documents: list[dict[str, Any]]) -> str:
    yaml = YAML()
    yaml.width = 4096  # a long command line stays on one line, as the engine gets it
    yaml.indent(mapping=2, sequence=4, offset=2)
    # Labels are shared between objects; written out each time, never as &anchors that
    # a reader of one object would have to chase.
    yaml.representer.ignore_aliases = lambda data: True
    out = StringIO()
    yaml.dump_all(documents, out)
    return HEADER.format(version=__version__) + out.getvalue()


def write_manifests(folder: Path, files: dict[str, str]) -> None:
    """Write `files` into `folder`, each by an atomic rename; UsageError when it cannot."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # A model dropped from the plan must not leave its Deployment behind in the folder
        # Argo CD syncs; only files this command wrote are removed.
        first_line = HEADER.split("\n", 1)[0].split("(")[0]
        for old in folder.glob("engine-*.yaml"):
            if old.name not in files and old.read_text("utf-8").startswith(first_line):
                old.unlink()
        for name, text in files.items():
            replace_file(folder / name, text.encode("utf-8"))
    except OSError as exc:
        raise UsageError(
            f"cannot write the manifests to {folder}: {exc.strerror or exc}; "
            "give --out a folder you may write to, or - for standard output."
        ) from None
