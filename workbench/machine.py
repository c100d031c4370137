"""What this machine can hold: its CPUs, its GPUs (the one GPU discovery) and whether a recipe's
estimated memory fits.

Apart from ``recipe.py`` so that the Recipe stays a pure schema: a recipe is valid or not
anywhere, while these checks ask the machine where a run starts (``train``, a local launch, the
run queue's GPU placement). ``workbench.recipe`` imports nothing from here. Nothing here imports
torch at import time (the driver's files and tool, the kernel's counters), so commands that do
not train stay light.
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

from workbench.model_facts import (ASSUMED_PROMPT_TOKENS, VLLM_CPU_KVCACHE_GIB, VLLM_GPU_MEMORY_UTILIZATION,
                                   TrainingFootprint, format_bytes, gpu_memory_bytes, host_memory_bytes, model_facts,
                                   training_footprint)
from workbench.recipe import Recipe, RecipeError

NVIDIA_GPUS_DIR = Path("/proc/driver/nvidia/gpus")  # one entry per GPU the NVIDIA driver sees
ROCM_DEVICE = Path("/dev/kfd")  # the ROCm kernel driver: AMD GPUs, which the NVIDIA driver does not list


def available_cpus() -> int:
    """CPUs this process may run on (the affinity mask, as taskset / cgroups set it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


_INDEX = re.compile(r"\+?\d+")  # strtoul's reading of an entry: its leading digits ("1gpu2" is 1)
_UUID_FORMS = ("GPU-", "MIG-")


def parse_visible_devices(value: str) -> list[int] | list[str]:
    """The devices a CUDA_VISIBLE_DEVICES value names, read as CUDA reads it (and torch.cuda's
    ``_parse_visible_devices``, which mirrors it): a list of indices, or, when the value starts
    with ``GPU-`` / ``MIG-``, of UUIDs of that form. Either list ends at its first entry that is
    not of its form: for indices an empty entry, "-1", any negative number or a UUID ("0,2,-1,1"
    names 0 and 2; "-1,0" and "" none; "0,,1" only 0); for UUIDs an entry of another form (a
    mix "GPU-a,0" names GPU-a alone). A device named twice before the end hides every device."""
    entries = value.split(",")
    form = next((f for f in _UUID_FORMS if value.startswith(f)), None)
    if form is not None:
        named: list = list(itertools.takewhile(lambda e: e.startswith(form), entries))
    else:
        matches = itertools.takewhile(bool, (_INDEX.match(e.strip()) for e in entries))
        named = [int(m.group()) for m in matches]
    return named if len(set(named)) == len(named) else []


def visible_gpus(*, torch_on_rocm: bool = False) -> list[int]:
    """Indices of the GPUs this process may use: the one GPU discovery (the run queue places runs
    on these; the machine checks count them). Torch is not imported unless asked.

    - CUDA_VISIBLE_DEVICES set: the indices it names, in its order, up to its first entry that
      is not one (``parse_visible_devices``: CUDA's reading). It is what the local launcher hands
      each run and what a user or scheduler sets, so it is taken as given (on WSL2 or in a
      container the driver's files may be absent). "" and "-1" hide every GPU; a list of
      ``GPU-<uuid>`` / ``MIG-<uuid>`` names no index (only the driver's tool could map them;
      ``visible_gpu_count`` counts them).
    - Else the NVIDIA driver's GPUs 0..n-1, one entry each under /proc/driver/nvidia/gpus.
    - Else (no NVIDIA driver) []: a CPU machine; on an AMD (ROCm) machine torch counts the GPUs
      only with ``torch_on_rocm`` (the queue, which must place runs there); the machine checks
      pass nothing and see no GPU, so `launch` and `train` stay torch-free before the engine.
    """
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d for d in parse_visible_devices(env) if isinstance(d, int)]
    if NVIDIA_GPUS_DIR.is_dir():
        return list(range(len(list(NVIDIA_GPUS_DIR.iterdir()))))
    if not (torch_on_rocm and ROCM_DEVICE.exists()):
        return []
    import torch

    return list(range(torch.cuda.device_count()))


def visible_gpu_count() -> int:
    """How many GPUs this process sees, for the machine checks: the devices CUDA_VISIBLE_DEVICES
    names, indices or ``GPU-<uuid>`` / ``MIG-<uuid>`` (a MIG slice or a scheduler's UUID list is
    a GPU to the run, though the queue cannot place it by index), else ``visible_gpus``."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    return len(visible_gpus()) if env is None else len(parse_visible_devices(env))


def memory_footprint(recipe: Recipe, processes: int = 1, *, on_gpu: bool = False) -> TrainingFootprint | None:
    """One training process's memory (model_facts.training_footprint), estimated from the model's
    config.json; None when its shape is not known before loading (tiny, an unconverted built-in,
    a hub id not cached, another architecture). A micro-batch is this process's share of the batch
    split into minibatches x grad_accum; sequences are max_prompt_length (else an assumed
    ASSUMED_PROMPT_TOKENS) + max_completion_length tokens."""
    facts = model_facts(recipe.model)
    if facts is None or facts.shape is None:
        return None
    s, t, lora = recipe.sampling, recipe.train, recipe.lora
    rows = max(1, recipe.batch_size // processes // (t.minibatches * t.grad_accum))
    footprint = training_footprint(
        facts.shape, lora_r=lora.r, lora_targets=lora.target_modules,
        reference_copy=recipe.algorithm.uses_reference and not lora.enabled, critic=recipe.algorithm.critic,
        behaviour_copy=t.staleness > 0, vllm_copy=t.rollout == "vllm", rows=rows,
        seq=(s.max_prompt_length or ASSUMED_PROMPT_TOKENS) + s.max_completion_length,
        completion=s.max_completion_length, precision=t.precision, checkpointing=t.gradient_checkpointing,
        scoring_rows=max(1, recipe.batch_size // processes))
    teacher = model_facts(recipe.teacher.model) if recipe.teacher.enabled else None
    if teacher is not None and teacher.shape is not None:  # on-policy distillation: fp32, no gradients
        footprint.parts["teacher"] = 4 * teacher.shape.num_parameters
    if t.rollout == "vllm" and not on_gpu:  # its KV cache on CPU (on a GPU: a share of the card, below)
        footprint.parts["vLLM KV cache"] = VLLM_CPU_KVCACHE_GIB * 2**30
    return footprint


def check_fits_memory(recipe: Recipe, processes: int, gpus: int, *, memory: int | None = None) -> None:
    """Refuse a recipe whose estimated footprint exceeds this machine's memory: one GPU's per
    process (less vLLM's share when it is colocated), or the RAM all CPU processes share.
    ``memory`` overrides what the machine reports (bytes)."""
    on_gpu = gpus > 0
    footprint = memory_footprint(recipe, processes, on_gpu=on_gpu)
    if footprint is None:
        return
    where = "GPU memory" if on_gpu else "RAM"
    if memory is None:
        memory = gpu_memory_bytes() if on_gpu else host_memory_bytes()
    if memory is None:  # a GPU whose memory the driver's tool did not report: nothing to compare
        return
    budget = memory * (1 - VLLM_GPU_MEMORY_UTILIZATION) if on_gpu and recipe.train.rollout == "vllm" else memory
    need = footprint.total * (1 if on_gpu else processes)
    if need > budget:
        per = "per GPU" if on_gpu else (f"for {processes} processes" if processes > 1 else "")
        raise RecipeError(
            f"model={recipe.model!r} does not fit: the run needs about {format_bytes(need)} {per} "
            f"({footprint.describe()}) and this machine has {format_bytes(budget)} of {where}; "
            "try lora.r (e.g. 16), train.gradient_checkpointing=true, train.precision=bf16, "
            "train.grad_accum or a smaller batch")


def check_processes_divide(recipe: Recipe, world: int) -> None:
    """Each of the launch's ``world`` processes samples an equal share of a step's prompts."""
    if recipe.sampling.prompts_per_step % world:
        raise RecipeError(f"sampling.prompts_per_step={recipe.sampling.prompts_per_step}: must divide among the "
                          f"{world} processes of this launch (a multiple of {world})")


def check_fits_machine(recipe: Recipe, processes: int = 1, *, world: int | None = None, cpus: int | None = None,
                       gpus: int | None = None, memory: int | None = None) -> None:
    """Refuse, before a run starts here, what this machine cannot hold.

    processes: one per GPU, or one per CPU when there is no GPU -> at most max(gpus, cpus).
    sampling.prompts_per_step: a multiple of the launch's processes (``world``, default
    ``processes``; under ``accelerate launch`` the CLI passes WORLD_SIZE), checked here, before the
    run directory is claimed, rather than in the trainer's set-up.
    train.threads: torch threads per CPU process -> at most the CPUs.
    Memory: the estimated footprint (check_fits_memory) -> at most the GPU's memory or the RAM.
    Raises RecipeError naming the field, the value and the limit.
    """
    cpus = available_cpus() if cpus is None else cpus
    gpus = visible_gpu_count() if gpus is None else gpus
    most = max(cpus, gpus)
    if processes < 1:
        raise RecipeError(f"--processes={processes}: at least 1")
    if processes > most:
        raise RecipeError(f"--processes={processes}: at most {most} on this machine ({cpus} CPUs, {gpus} GPUs)")
    check_processes_divide(recipe, processes if world is None else world)
    if recipe.train.threads > cpus:
        raise RecipeError(f"train.threads={recipe.train.threads}: at most {cpus}, the CPUs of this machine")
    check_fits_memory(recipe, processes, gpus, memory=memory)
