"""Launch recipes for disaggregated prefill/decode (vLLM): every prefill and decode engine and
vllm-router joining them, as a bash script for one machine, a Ray cluster script, a Kubernetes
manifest (each pool a Deployment or, spanning nodes, a LeaderWorkerSet; the router finds the pods
by label) and an llm-d ModelService values file.

Each pool engine's command comes from the adapter (``build_argv`` on the pool's features, as the
group launch builds it); the router's from ``router_argv``. Values are quoted for their
destination, secrets referenced from the environment or a Kubernetes Secret, never written.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from typing import Any

import yaml

from app.errors import UserError
from app.export.quoting import comment_text, slug
from engine_adapters.config import DEMO_MODEL, Features, PdRole
from engine_adapters.disaggregation import POOL_ROLES, pool_features
from engine_adapters.registry import get_adapter
from engine_adapters.vllm import NIXL_ENV, ROUTER_API_KEY_ENV

PD_FORMATS = ("bash", "ray", "k8s-multinode", "llm-d")
"""The formats a P/D configuration exports to."""
ROUTER_PACKAGES = "vllm-router==0.1.17 orjson"
NIXL_PACKAGES = "nixl-cu12==1.5.1 nixl"
SIDE_PORT_OFFSET = 100
"""One machine: engine k listens on PORT + 1 + k and its NIXL side channel on PORT + 100 + k."""
LLM_D_IMAGE = "ghcr.io/llm-d/llm-d"


def _yaml_value(value: str) -> str:
    """Kubernetes expands ``$(VAR)`` in args and env values: ``$$`` keeps a dollar literal."""
    return value.replace("$", "$$")


class _Pd:
    """What every P/D recipe is made from: the header, each pool's engine arguments (without
    the model, host and port, which each recipe places) and the secrets."""

    def __init__(self, launch_mod: Any, spec: Any, fmt: str) -> None:
        self.spec, self.fmt = spec, fmt
        config = spec.config
        self.features: Features = config.features
        adapter = get_adapter(config.engine.kind)
        if config.engine.kind != "vllm":
            raise UserError(f"a disaggregated prefill/decode recipe is exported for vLLM (with vllm-router); "
                            f"{adapter.display_name}'s P/D is launched from its own router (not exported yet)")
        if fmt not in PD_FORMATS:
            raise UserError(f"a disaggregated prefill/decode configuration exports to --format "
                            f"{', '.join(PD_FORMATS)}, not --format {fmt}")
        self.adapter = adapter
        self.pools: dict[PdRole, Any] = {}
        self.args: dict[PdRole, list[str]] = {}
        for role in POOL_ROLES:
            pool_spec = replace(spec, config=config.model_copy(
                update={"features": pool_features(self.features, role)}))
            launch = launch_mod._launch(pool_spec, docker=False, cli=True)
            at = launch.server_at(launch.argv)
            self.pools[role] = launch
            # `vllm serve MODEL --host H --port P FLAGS`: the flags after the server arguments
            self.args[role] = launch.argv[at + 4:]
        self.launch = self.pools["decode"]
        self.header = launch_mod._header(spec, self.launch, False)
        masked = [n for n in self.launch.feature_notes if n.startswith("secret values")]
        self.notes = launch_mod._feature_notes(self.features) + masked
        self.secrets: list[str] = self.launch.secrets
        self.model = self.launch.argv[2]
        self.served = self.launch.engine.served_model_name or self.model
        self.env: dict[str, str] = self.launch.env
        self.health = adapter.health_path
        self.timeout_s = launch_mod._startup_timeout_s(spec)
        self.cpu = launch_mod.is_cpu_run(spec)
        self.slug = slug(config.name)
        self.port = self.launch.port

    def pool_gpus(self, role: PdRole) -> int:
        return self.features.pool_tensor_parallel_size(role) * self.features.pipeline_parallel_size

    def comment_lines(self, extra: list[str]) -> list[str]:
        h = self.header
        f = self.features
        d = f.disaggregation
        lines = [f"{h['name']}: disaggregated prefill/decode ({h['engine_name']} + vllm-router) exported by tunebench "
                 f"{h['tunebench_version']} on {h['date']}",
                 f"from {h['source']}.",
                 f"Engine: {h['engine_name']} {h['engine_version']}; install: {h['install_hint']}",
                 f"P/D packages beside the engine: pip install --no-deps {NIXL_PACKAGES} (NIXL), "
                 f"pip install {ROUTER_PACKAGES} (the router)",
                 f"Model: {h['model']}; clients ask for model: {self.served}",
                 f"Connector: {d.connector}; prefill pool: {d.prefill_instances} engine(s)"
                 + ("" if self.cpu else f" x {self.pool_gpus('prefill')} GPU(s)")
                 + f"; decode pool: {d.decode_instances} engine(s)"
                 + ("" if self.cpu else f" x {self.pool_gpus('decode')} GPU(s); {f.gpu_count} GPUs in all"),
                 *[f"Feature: {n}" for n in self.notes], *h["measured_binding"], *extra,
                 "Secrets are read from the environment and never written here: " + (" ".join(self.secrets) or "(none)")]
        return ["# " + comment_text(line) for line in lines]

    # -- one machine, or a Ray cluster's head -------------------------------------------------------

    def members(self) -> list[tuple[PdRole, int]]:
        return [(role, i) for role in POOL_ROLES for i in range(self.features.pool_instances(role))]

    def bash(self, ray: bool) -> str:
        q = shlex.quote
        lines = ["#!/usr/bin/env bash",
                 "# shellcheck disable=SC2016  # single-quoted values are literal on purpose: nothing in them may expand",
                 *self.comment_lines([
            "Every engine and the router on this machine: the router on PORT, engine k on PORT + 1 + k, its "
            f"NIXL side channel on PORT + {SIDE_PORT_OFFSET} + k; logs in LOG_DIR. Ctrl-C stops them all."
            if not ray else
            "A Ray cluster: ROLE=worker on every other node joins the head; ROLE=head waits for the pools' GPUs, "
            "then starts each engine with the ray executor (its workers placed on the cluster), then the router.",
            "NIXL's side channel listens on each engine's first worker at VLLM_NIXL_SIDE_CHANNEL_HOST: where Ray places "
            "that worker on another node, set it to that node's address there (not measured by tunebench)."]),
            "# Usage: " + ("PORT=8000 ./this-script" if not ray else
                           "ROLE=head HOST=0.0.0.0 ./this-script | ROLE=worker HEAD_ADDRESS=<head IP> ./this-script"),
            "#   then: tunebench run PROFILE --endpoint http://<this host>:PORT",
            "set -euo pipefail", ""]
        api_key = self.adapter.api_key_env

        def require(names: list[str]) -> list[str]:
            return [line for s in names for line in (
                f': "${{{s}:?set {s} in the environment; it is never written into this script}}"', f"export {s}")]

        lines += require([s for s in self.secrets if s != api_key or not ray])  # a Ray worker serves no API
        lines += [f"export {k}={q(v)}" for k, v in self.env.items()]
        if ray:
            cluster_gpus = 0 if self.cpu else self.features.gpu_count
            lines += [
                ': "${ROLE:?set ROLE=head on the head node, ROLE=worker on every other node}"',
                'if [[ -z "${RAY_PORT:-}" ]]; then RAY_PORT=6379; fi',
                'if [[ -z "${RAY_WAIT_S:-}" ]]; then RAY_WAIT_S=900; fi',
                f"CLUSTER_GPUS={cluster_gpus}",
                "command -v ray >/dev/null || { echo \"ray is needed on every node (pip install ray)\" >&2; exit 1; }",
                'case "$ROLE" in',
                '  worker)',
                '    : "${HEAD_ADDRESS:?set HEAD_ADDRESS to the address of the head node}"',
                '    exec ray start --address "$HEAD_ADDRESS:$RAY_PORT" --block',
                '    ;;',
                '  head) ;;',
                '  *) echo "ROLE must be head or worker, not \'$ROLE\'" >&2; exit 2 ;;',
                'esac',
                *require([s for s in self.secrets if s == api_key]),
                'ray start --head --port "$RAY_PORT"',
                "trap 'ray stop >/dev/null 2>&1 || true' EXIT",
                *[line.rstrip("\n") for line in _ray_wait_lines()]]
        lines += [f'if [[ -z "${{HOST:-}}" ]]; then HOST={q(self.launch.host)}; fi',
                  f'if [[ -z "${{PORT:-}}" ]]; then PORT={self.port}; fi',
                  'if [[ -z "${ENGINE_BIN:-}" ]]; then ENGINE_BIN=vllm; fi',
                  'if [[ -z "${PYTHON:-}" ]]; then PYTHON=python3; fi',
                  'if [[ -z "${LOG_DIR:-}" ]]; then LOG_DIR=.; fi',
                  f'if [[ -z "${{STARTUP_TIMEOUT_S:-}}" ]]; then STARTUP_TIMEOUT_S={self.timeout_s}; fi',
                  "command -v curl >/dev/null || { echo \"curl is needed to wait for the engines' health\" >&2; exit 1; }",
                  'HEALTH_HOST=$HOST',
                  'if [[ "$HEALTH_HOST" == "0.0.0.0" ]]; then HEALTH_HOST=127.0.0.1; fi',
                  "pids=()",
                  "stop_all() { for pid in \"${pids[@]}\"; do kill -TERM -- \"-$pid\" 2>/dev/null || true; done; wait || true; }",
                  "trap 'stop_all; exit 130' INT TERM",
                  "wait_ready() {  # NAME PORT PID",
                  '  local deadline=$((SECONDS + STARTUP_TIMEOUT_S))',
                  f'  until curl -fsS -o /dev/null "http://${{HEALTH_HOST}}:$2"{q(self.health)}; do',
                  '    if ! kill -0 "$3" 2>/dev/null; then echo "$1 exited during startup (see $LOG_DIR/$1.log)" >&2; '
                  'stop_all; exit 1; fi',
                  '    if (( SECONDS >= deadline )); then echo "$1 was not ready after $STARTUP_TIMEOUT_S s" >&2; '
                  'stop_all; exit 1; fi',
                  '    sleep 1',
                  '  done',
                  '}', ""]
        ray_args = ["--distributed-executor-backend", "ray"] if ray else []
        for k, (role, i) in enumerate(self.members()):
            name = f"{role}-{i}"
            env = [f"VLLM_NIXL_SIDE_CHANNEL_PORT=$((PORT + {SIDE_PORT_OFFSET + k}))",
                   *([] if ray else ['VLLM_NIXL_SIDE_CHANNEL_HOST="$HEALTH_HOST"']),
                   *(f"{key}={q(v)}" for key, v in NIXL_ENV.items() if self.cpu)] \
                if self.features.disaggregation.connector == "nixl" else []
            words = ['"$ENGINE_BIN"', "serve", q(self.model), "--host", '"$HOST"', "--port", f'"$((PORT + {1 + k}))"',
                     *(q(a) for a in self.args[role] + ray_args)]
            lines += [f"# {name}: {self.pool_gpus(role)} GPU(s)",
                      f"{' '.join(['setsid', 'env', *env, *words])} > \"$LOG_DIR\"/{name}.log 2>&1 &",
                      "pids+=(\"$!\")"]
        for k, (role, i) in enumerate(self.members()):
            lines.append(f'wait_ready {role}-{i} "$((PORT + {1 + k}))" "${{pids[{k}]}}"')
        prefill = [(f"@{k}@", 0) for k, (role, _) in enumerate(self.members()) if role == "prefill"]
        decode = [f"@{k}@" for k, (role, _) in enumerate(self.members()) if role == "decode"]
        metrics_port = self.port + 1000
        router = self.adapter.router_argv(self.launch.engine, self.features, prefill, decode, self.port,  # type: ignore[attr-defined]
                                          metrics_port=metrics_port, portable=True)
        urls = {f"@{k}@": f'"http://${{HEALTH_HOST}}:$((PORT + {1 + k}))"' for k in range(len(self.members()))}
        port_words = {str(self.port): '"$PORT"', str(metrics_port): '"$((PORT + 1000))"', self.launch.host: '"$HOST"'}
        words = ['"$PYTHON"', *(urls.get(a) or port_words.get(a) or q(a) for a in router[1:])]
        key_env = [f'{ROUTER_API_KEY_ENV}="${self.adapter.api_key_env}"'] if self.adapter.api_key_env in self.secrets else []
        lines += ["# the router: the pools' engines behind one endpoint (its metrics on PORT + 1000)",
                  f"{' '.join(['setsid', 'env', *key_env, *words])} > \"$LOG_DIR\"/router.log 2>&1 &",
                  'pids+=("$!")', f'wait_ready router "$PORT" "${{pids[{len(self.members())}]}}"',
                  'echo "P/D ready at http://${HEALTH_HOST}:${PORT}; Ctrl-C stops every engine and the router"',
                  "wait"]
        return "\n".join(lines) + "\n"

    # -- Kubernetes ---------------------------------------------------------------------------------

    def _env(self, role: PdRole | None) -> list[dict[str, Any]]:
        env: list[dict[str, Any]] = [{"name": s, "valueFrom": {"secretKeyRef": {"name": f"{self.slug}-secrets", "key": s}}}
                                     for s in self.secrets]
        env += [{"name": k, "value": _yaml_value(v)} for k, v in self.env.items()]
        if role is not None and self.features.disaggregation.connector == "nixl":
            env += [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(self.port + SIDE_PORT_OFFSET)}]
            env += [{"name": k, "value": v} for k, v in NIXL_ENV.items() if self.cpu]
        return env

    def _resources(self, role: PdRole) -> dict[str, Any]:
        return {} if self.cpu else {"resources": {"limits": {"nvidia.com/gpu": self.pool_gpus(role)}}}

    def k8s(self) -> str:
        image = str(self.header["image_hint"])  # the official image (CPU or GPU) at the measured version
        docs: list[dict[str, Any]] = []
        pool_label = {role: f"{self.slug}-{role}" for role in POOL_ROLES}
        for role in POOL_ROLES:
            args = ["serve", self.model, "--host", "0.0.0.0", "--port", str(self.port), *self.args[role]]  # noqa: S104
            container = {"name": "vllm", "image": image, "command": ["vllm"], "args": [_yaml_value(a) for a in args],
                         "ports": [{"containerPort": self.port}, {"containerPort": self.port + SIDE_PORT_OFFSET}],
                         "env": self._env(role), **self._resources(role),
                         "readinessProbe": {"httpGet": {"path": self.health, "port": self.port}, "periodSeconds": 5,
                                            "failureThreshold": 360}}
            docs.append({"apiVersion": "apps/v1", "kind": "Deployment",
                         "metadata": {"name": pool_label[role], "labels": {"app": pool_label[role]}},
                         "spec": {"replicas": self.features.pool_instances(role),
                                  "selector": {"matchLabels": {"app": pool_label[role]}},
                                  "template": {"metadata": {"labels": {"app": pool_label[role]}},
                                               "spec": {"containers": [container]}}}})
        router_args = ["--host", "0.0.0.0", "--port", str(self.port), "--vllm-pd-disaggregation",  # noqa: S104
                       "--service-discovery", "--prefill-selector", f"app={pool_label['prefill']}",
                       "--decode-selector", f"app={pool_label['decode']}", "--service-discovery-port", str(self.port),
                       "--service-discovery-namespace", "$(POD_NAMESPACE)",
                       "--kv-connector", self.features.disaggregation.connector or "nixl"]
        router_env = [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
        if self.adapter.api_key_env in self.secrets:
            router_env.append({"name": ROUTER_API_KEY_ENV, "valueFrom": {"secretKeyRef": {
                "name": f"{self.slug}-secrets", "key": self.adapter.api_key_env}}})
        router = {"name": "router", "image": image, "command": ["bash", "-c",
                  f"pip install {ROUTER_PACKAGES} && exec python3 -m vllm_router.launch_router \"$@\"", "router"],
                  "args": router_args, "ports": [{"containerPort": self.port}], "env": router_env}
        name = f"{self.slug}-router"
        docs += [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name},
             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name},
             "subjects": [{"kind": "ServiceAccount", "name": name}],
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}},
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": {"app": name}},
             "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                      "template": {"metadata": {"labels": {"app": name}},
                                   "spec": {"serviceAccountName": name, "containers": [router]}}}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": self.slug},
             "spec": {"selector": {"app": name}, "ports": [{"port": self.port, "targetPort": self.port}]}}]
        head = self.comment_lines([
            "Each pool a Deployment (replicas = its engines, GPUs per pod = its tensor x pipeline parallel size); "
            "the router finds their pods by label (Kubernetes service discovery) and is reached at the Service.",
            f"Usage: kubectl create secret generic {self.slug}-secrets" +
            "".join(f" --from-literal={s}=..." for s in self.secrets) + "; kubectl apply -f this-file",
            f"then: tunebench run PROFILE --endpoint http://<service {self.slug}>:{self.port}"])
        return "\n".join(head) + "\n" + yaml.safe_dump_all(docs, sort_keys=False, width=120)

    def llm_d(self) -> str:
        """An llm-d ModelService (Helm chart llm-d-modelservice) values file: its routing proxy
        joins the pools; the chart adds the model, host and port (``modelCommand: vllmServe``).
        The served name is ``modelArtifacts.name`` (the chart refuses ``routing.modelName``)."""
        connector = {"nixl": "nixlv2"}.get(self.features.disaggregation.connector or "", None)
        if connector is None:
            raise UserError(f"llm-d's routing proxy joins pools over NIXL; this configuration's connector is "
                            f"{self.features.disaggregation.connector}")

        def pool(role: PdRole) -> dict[str, Any]:
            gpus = self.pool_gpus(role)
            return {"create": True, "replicas": self.features.pool_instances(role),
                    "parallelism": {"tensor": self.features.pool_tensor_parallel_size(role)},
                    "containers": [{"name": "vllm", "image": f"{LLM_D_IMAGE}:latest", "modelCommand": "vllmServe",
                                    "args": [_yaml_value(a) for a in self.args[role]], "env": self._env(role),
                                    "ports": [{"containerPort": self.port + SIDE_PORT_OFFSET, "protocol": "TCP"}],
                                    **({} if self.cpu else {"resources": {"limits": {"nvidia.com/gpu": gpus},
                                                                          "requests": {"nvidia.com/gpu": gpus}}}),
                                    "mountModelVolume": True}]}
        model = self.spec.config.engine.model
        local = model == DEMO_MODEL or model.startswith((".", "/", "~"))
        uri = f"pvc://model/{self.served}" if local else f"hf://{model}"
        values = {"multinode": False,
                  "modelArtifacts": {"uri": uri, "name": self.served},
                  "routing": {"servicePort": self.port, "proxy": {"enabled": True, "connector": connector}},
                  "decode": pool("decode"), "prefill": pool("prefill")}
        head = self.comment_lines([
            *(["The model is a local folder here: copy it to a volume and point modelArtifacts.uri at it "
               "(pvc://<claim>/<path>)"] if local else []),
            "llm-d ModelService values: helm install MODEL llm-d-modelservice/llm-d-modelservice -f this-file "
            "(https://github.com/llm-d-incubation/llm-d-modelservice); the secrets come from "
            f"the Secret {self.slug}-secrets."])
        return "\n".join(head) + "\n" + yaml.safe_dump(values, sort_keys=False, width=120)


def _ray_wait_lines() -> list[str]:
    from app.export.quoting import templates

    return templates().get_template("_ray_wait.sh.j2").render().splitlines()


def render_pd(spec: Any, fmt: str, launch_mod: Any) -> str:
    """The recipe for a disaggregated prefill/decode configuration in ``fmt``; ``launch_mod`` is
    ``app.export.launch``, whose pieces (the adapter's launch, the header) every recipe shares,
    passed in by it (it imports this module)."""
    pd = _Pd(launch_mod, spec, fmt)
    if fmt in ("bash", "ray"):
        return pd.bash(ray=fmt == "ray")
    if fmt == "k8s-multinode":
        return pd.k8s()
    return pd.llm_d()
