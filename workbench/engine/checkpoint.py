"""Checkpoints of a run, resume in the same run, and the trained policy as a plain HF directory.

Layout of ``run_dir``::

    checkpoints/step-00000009/      the state after step 9 (``checkpoint.every`` steps and the last step)
        model.safetensors, config.json, generation_config.json   the policy (``save_pretrained``)
        adapter_model.safetensors, adapter_config.json            instead, with LoRA: the adapters (the base is frozen)
        tokenizer.json, tokenizer_config.json, ...                the tokenizer
        optimizer.pt, scheduler.pt (+ scaler.pt under fp16)       state dicts (``torch.save``)
        critic.safetensors, critic_optimizer.pt                   PPO's critic and its optimiser
        rng-rank{r}.pt                                            python / numpy / torch CPU (+ CUDA) RNG of rank r
        trainer_state.json                                        step, tokens_seen, num_tokens, world_size,
                                                                  entropy_control (coef, last_entropy), kl_control
                                                                  (coef): written last
    final/                          the finished policy + tokenizer: ``AutoModelForCausalLM.from_pretrained(final)``
                                    (LoRA: the merged weights W + B A alpha / r, a plain model without PEFT)
    final_adapter/                  LoRA only: the adapters alone, ``PeftModel.from_pretrained(base, final_adapter)``

Atomic: a checkpoint is written into a hidden ``.tmp-step-N`` folder and renamed to ``step-N`` by
rank 0 once every rank has written its RNG states (a barrier), so a crash leaves a complete
checkpoint or none (a stale temp folder is removed by the next save). A checkpoint is removed
(``keep_last``, a step saved again) by renaming it to a hidden ``.tmp-`` name first, so a crash
mid-removal never leaves a ``step-N`` folder with part of its files. Only rank 0 writes model,
tokenizer and optimiser files (data parallelism keeps them equal on every rank); each rank writes
and reads back its own RNG states. ``keep_last`` newest checkpoints are kept.

Integrity: ``manifest.json`` (every file's size and sha256, the step, the run's recipe digest) is
written last inside the temporary folder. Resume (``train --resume RUN_DIR``) verifies it before
anything is written (:func:`choose_resume_checkpoint`): a damaged, incomplete or foreign newest
checkpoint is skipped for the newest intact one, and the run's warnings say so; with none intact
the resume is refused.

Resume loads that checkpoint into the freshly set-up trainer and
continues at the step after it, appending to the same ``events.jsonl``. Its first event is
``resume`` at that step: the run store drops every row of that step and later (the crashed
attempt's), so each step is stored once, with the resumed attempt's values.

The trainer's own randomness needs no saved state: prompt order (``_epoch_order(seed, epoch)``),
sampling (``hf_generate`` seeds torch from (seed, step, rank); vLLM seeds each completion) and
minibatch order (a Generator seeded from (seed, step)) are pure functions of (seed, step, rank),
so step k draws the same numbers whether or not the run was resumed before it. The global RNG
states are saved anyway for whatever else draws (dropout, a reward function).

Torch is imported inside the functions that need it: the run layer and the UI list checkpoints
and final directories without it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.core.entropy_control import EntropyControlState

CHECKPOINTS_DIR = "checkpoints"
FINAL_DIR = "final"
FINAL_ADAPTER_DIR = "final_adapter"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
SCALER_FILE = "scaler.pt"
CRITIC_FILE = "critic.safetensors"
CRITIC_OPTIMIZER_FILE = "critic_optimizer.pt"
MANIFEST_FILE = "manifest.json"
_STEP_DIR = re.compile(r"step-(\d{8})")
_TMP_PREFIX = ".tmp-"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used for this run (message says which and why)."""


@dataclass
class TrainState:
    """What a run carries from one step to the next besides the weights, optimisers, schedule and
    RNGs (saved beside them): the cumulative token counts its metrics report, the adaptive
    entropy controller's state and the KL coefficient the next step uses (algorithm.kl_controller:
    adaptive moves it, fixed keeps kl_coef). Saved as ``trainer_state.json`` (with the step and world size)."""

    entropy: EntropyControlState
    kl_coef: float = 0.0  # beta of the next step's KL (verl's kl_ctrl.value)
    tokens_seen: float = 0.0  # completion tokens (perf/tokens)
    num_tokens_seen: float = 0.0  # prompt + completion tokens (TRL's num_tokens)

    def to_json(self, step: int, world: int) -> dict[str, Any]:
        """The checkpoint's record (adaptive entropy control as TRL's entropy_ctrl_state.json; inf -> null)."""
        ent = self.entropy
        return {"step": step, "tokens_seen": self.tokens_seen, "num_tokens": self.num_tokens_seen, "world_size": world,
                "entropy_control": {"coef": ent.coef, "last_entropy": ent.last_entropy if math.isfinite(ent.last_entropy) else None},
                "kl_control": {"coef": self.kl_coef}}

    def restored(self, state: dict[str, Any]) -> "TrainState":
        """This state with a checkpoint's record read back. Records from before a field existed
        keep this state's value for it (num_tokens: 0; the entropy controller starts afresh; the KL
        coefficient: kl_coef, which is what a run without the adaptive controller always had)."""
        entropy = self.entropy
        if "entropy_control" in state:
            ent = state["entropy_control"]
            entropy = EntropyControlState(coef=float(ent["coef"]),
                                          last_entropy=math.inf if ent["last_entropy"] is None else float(ent["last_entropy"]))
        kl_coef = float(state["kl_control"]["coef"]) if "kl_control" in state else self.kl_coef
        return TrainState(entropy=entropy, kl_coef=kl_coef, tokens_seen=float(state["tokens_seen"]),
                          num_tokens_seen=float(state.get("num_tokens", 0.0)))


# -- paths (no torch) ----------------------------------------------------------------------------
def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR / f"step-{step:08d}"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints (their ``trainer_state.json`` exists) as (step, path), oldest first."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.fullmatch(p.name)) and (p / STATE_FILE).is_file()]
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """(step, path) of the newest complete checkpoint, or None."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def final_model_dir(run_dir: Path) -> Path | None:
    """``run_dir/final`` once the finished policy is saved there, else None."""
    path = Path(run_dir) / FINAL_DIR
    return path if (path / "config.json").is_file() else None


def checkpoint_due(step: int, every: int, last_step: int) -> bool:
    """Save after ``step``? Every ``every`` steps (steps every-1, 2 every-1, ...) and after the last one."""
    return step == last_step or (every > 0 and (step + 1) % every == 0)


def resume_start(run_dir: Path) -> int:
    """The step a resume of ``run_dir`` begins at: one after the newest checkpoint, else 0."""
    latest = latest_checkpoint(run_dir)
    return 0 if latest is None else latest[0] + 1


def drop_torn_tail(path: Path) -> int:
    """Cut a last line without its newline (a kill -9 mid-write) so appended events start on a
    line of their own; returns the bytes removed. Only bytes after the last newline go, which no
    reader has consumed (readers take complete lines only)."""
    path = Path(path)
    if not path.is_file():
        return 0
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        keep, block = size, 4096
        while keep > 0:
            start = max(0, keep - block)
            f.seek(start)
            chunk = f.read(keep - start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            keep = start
        f.truncate(keep)
    return size - keep


# -- manifest and verification (no torch) -----------------------------------------------------------
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)


def write_manifest(ckpt: Path, step: int, recipe_sha256: str | None) -> None:
    """``manifest.json``: every file's size and sha256, the step and the run's recipe digest;
    written last and atomically (temp file + rename), so a checkpoint with a manifest is complete."""
    files = {p.relative_to(ckpt).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in _files(ckpt)}
    data = {"format": 1, "step": step, "recipe_sha256": recipe_sha256, "files": files}
    tmp = ckpt / (MANIFEST_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, ckpt / MANIFEST_FILE)


def _state_step(path: Path) -> tuple[int, int]:
    """(step, world_size) of ``trainer_state.json``; ValueError when it is unreadable."""
    state = json.loads((path / STATE_FILE).read_text())
    step, world = state.get("step"), state.get("world_size", 1)
    if not isinstance(step, int) or isinstance(step, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"{STATE_FILE} has step={str(step)[:20]} world_size={str(world)[:20]}")
    return step, world


def _why_unusable(path: Path, step: int, steps: int, recipe_sha256: str | None, manifest: dict | None) -> str | None:
    """Why the checkpoint ``path`` of ``step`` cannot resume this run (None: it can)."""
    if not 0 <= step < steps:
        return f"step {step} is outside this run's steps 0..{steps - 1}"
    if manifest is not None:
        if manifest.get("step") != step:
            return f"its manifest is of step {str(manifest.get('step'))[:20]}"
        recorded = manifest.get("recipe_sha256")
        if recipe_sha256 is not None and recorded is not None and recorded != recipe_sha256:
            return "it was written by another recipe"
        files = manifest.get("files")
        if not isinstance(files, dict) or not files:
            return "its manifest lists no files"
        for name, meta in files.items():
            file = path / name
            if not file.is_file():
                return f"{name} is missing"
            if not isinstance(meta, dict) or file.stat().st_size != meta.get("size"):
                return f"{name} has {file.stat().st_size} bytes, the manifest says {meta.get('size') if isinstance(meta, dict) else '?'}"
            if _sha256(file) != meta.get("sha256"):
                return f"{name} does not match its checksum (damaged)"
    try:
        state_step, world = _state_step(path)
    except (OSError, ValueError) as err:
        return f"{STATE_FILE} is unreadable ({str(err)[:80]})"
    if state_step != step:
        return f"{STATE_FILE} says step {state_step}"
    needed = [OPTIMIZER_FILE, SCHEDULER_FILE, *(f"rng-rank{r}.pt" for r in range(world))]
    missing = [n for n in needed if not (path / n).is_file()]
    if not any(path.glob("*model*.safetensors")):
        missing.insert(0, "model*.safetensors")
    return f"{missing[0]} is missing" if missing else None


def _read_manifest(path: Path) -> dict | None | str:
    """The manifest (dict), None when there is none, or why it cannot be read (str)."""
    try:
        data = json.loads((path / MANIFEST_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        return f"{MANIFEST_FILE} is unreadable ({str(err)[:80]})"
    return data if isinstance(data, dict) else f"{MANIFEST_FILE} is not an object"


def choose_resume_checkpoint(run_dir: Path, steps: int, recipe_sha256: str | None = None, *,
                             require_manifest: bool = False) -> tuple[Path | None, list[str]]:
    """The newest checkpoint of ``run_dir`` that is intact and belongs to this run, and warnings
    about the newer ones that were skipped (read-only; the resume loads exactly this one).

    Intact: its ``manifest.json`` lists every file with the size and sha256 found now, the step of
    its name, its manifest and its ``trainer_state.json`` agree and lie in ``0..steps-1``, and the
    manifest's recipe digest is the run's. A checkpoint *without* a manifest cannot be verified:
    with ``require_manifest`` (the run has ``run.json``: the version that started it writes
    manifests, so a missing one means a save or a removal cut short) it is never used; otherwise
    (a run older than manifests) it is skipped with a warning while a verified one exists below
    it, and else used with a warning, after the checks that need no manifest (state step, the
    optimiser, scheduler and RNG files).
    None: the run has no checkpoint (start at step 0). CheckpointError: checkpoints exist and none
    is usable (the message says why for each).
    """
    root = Path(run_dir) / CHECKPOINTS_DIR
    found = sorted(((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.fullmatch(p.name)) and p.is_dir()),
                   reverse=True) if root.is_dir() else []
    skipped: list[str] = []
    unverified: list[tuple[int, Path]] = []
    for step, path in found:
        manifest = _read_manifest(path)
        why = manifest if isinstance(manifest, str) else _why_unusable(path, step, steps, recipe_sha256, manifest)
        if why is None and manifest is None and require_manifest:
            why = f"it has no {MANIFEST_FILE} (a save or a removal was cut short) and cannot be verified"
        elif why is None and manifest is None:
            unverified.append((step, path))
            why = f"it has no {MANIFEST_FILE} (written by an older version) and cannot be verified"
        elif why is None:
            warnings = [f"checkpoint {p.name} skipped: {w}" for p, w in skipped]
            if skipped:
                warnings.append(f"resumed from {path.name}, the newest intact checkpoint")
            return path, warnings
        skipped.append((path, why))
    if unverified:
        step, path = unverified[0]
        warnings = [f"checkpoint {p.name} skipped: {w}" for p, w in skipped if p != path]
        return path, warnings + [f"resumed from {path.name} without a manifest (an older version wrote it): its "
                                 "files could not be verified"]
    if found:
        reasons = "; ".join(f"{p.name}: {w}" for p, w in skipped[:4])
        raise CheckpointError(f"cannot resume {run_dir}: none of its {len(found)} checkpoint(s) is intact ({reasons})")
    return None, []


# -- save ------------------------------------------------------------------------------------------
def _rng_state() -> dict[str, Any]:
    """This process's global RNG states as tensors and plain numbers (loadable with weights_only)."""
    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": (version, list(internal), gauss),
             "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _save_model_files(trainer, out: Path) -> None:
    """Rank 0: policy, tokenizer, optimiser, scheduler (, scaler, critic): the state shared by all ranks."""
    import torch
    from safetensors.torch import save_model

    acc = trainer.accelerator
    acc.unwrap_model(trainer.policy).save_pretrained(out, safe_serialization=True)  # LoRA: the adapters
    trainer.tokenizer.save_pretrained(out)
    torch.save(trainer.optimizer.state_dict(), out / OPTIMIZER_FILE)
    torch.save(trainer.scheduler.state_dict(), out / SCHEDULER_FILE)
    if getattr(acc, "scaler", None) is not None:
        torch.save(acc.scaler.state_dict(), out / SCALER_FILE)
    if getattr(trainer, "critic", None) is not None:
        save_model(acc.unwrap_model(trainer.critic), str(out / CRITIC_FILE))  # handles the shared tensors
        torch.save(trainer.critic_optimizer.state_dict(), out / CRITIC_OPTIMIZER_FILE)


def save_checkpoint(trainer, step: int) -> Path:
    """Write the state after ``step`` (all ranks call this); returns the checkpoint's path.

    ``manifest.json`` (sizes and checksums of every file) is written last, then the folder is
    renamed into place. A save that fails (a full disk) removes its temporary folder, so it does
    not keep the disk full, and raises: the run ends failed. With several processes only the rank
    that raised ends at once; the others wait at this function's next barrier until the launcher
    ends them (``accelerate launch`` / torchrun stop every process when one exits with an error)
    or the process group's timeout passes."""
    import torch

    acc = trainer.accelerator
    final = checkpoint_dir(trainer.run_dir, step)
    tmp = final.with_name(_TMP_PREFIX + final.name)
    try:
        if acc.is_main_process:
            for stale in final.parent.glob(_TMP_PREFIX + "*") if final.parent.is_dir() else ():
                shutil.rmtree(stale, ignore_errors=True)  # a save a crash interrupted
            tmp.mkdir(parents=True)
        acc.wait_for_everyone()
        torch.save(_rng_state(), tmp / f"rng-rank{trainer.rank}.pt")
        if acc.is_main_process:
            _save_model_files(trainer, tmp)
        acc.wait_for_everyone()  # every rank's RNG file is in place
        if acc.is_main_process:
            (tmp / STATE_FILE).write_text(json.dumps(trainer.state.to_json(step, trainer.world)))
            write_manifest(tmp, step, trainer.recipe_sha256)
            if final.exists():  # the same step saved by an attempt that crashed before it counted
                _remove_dir(final)
            os.replace(tmp, final)
            _prune(trainer.run_dir, trainer.recipe.checkpoint.keep_last)
    finally:
        if acc.is_main_process and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)  # a failed save (disk full) leaves no temporary folder
    acc.wait_for_everyone()
    return final


def _remove_dir(path: Path) -> None:
    """Remove a checkpoint or final folder: renamed to a hidden ``.tmp-`` name first (one atomic
    step), then deleted, so a crash mid-deletion leaves a temporary folder (removed by the next
    save) and never a ``step-N`` with part of its files."""
    doomed = path.with_name(f"{_TMP_PREFIX}removed-{path.name}")
    shutil.rmtree(doomed, ignore_errors=True)  # left by a removal a crash cut short
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _prune(run_dir: Path, keep_last: int) -> None:
    for _, path in list_checkpoints(run_dir)[:-keep_last]:
        _remove_dir(path)


def save_if_due(trainer, step: int) -> Path | None:
    """After step ``step``: a checkpoint when ``checkpoint.every`` or the last step says so."""
    cfg = trainer.recipe.checkpoint
    if not checkpoint_due(step, cfg.every, trainer.recipe.train.steps - 1):
        return None
    return save_checkpoint(trainer, step)


def _replace_dir(target: Path, write) -> None:
    """``write(tmp)`` into a hidden sibling, then rename it over ``target`` (a crash leaves the old or the new)."""
    tmp = target.with_name(_TMP_PREFIX + target.name)
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    if target.exists():
        _remove_dir(target)
    os.replace(tmp, target)


def save_final(trainer) -> Path:
    """The finished policy and tokenizer as a plain HF directory ``run_dir/final`` (rank 0 writes;
    atomic like a checkpoint). A LoRA policy: ``final`` holds the merged weights and
    ``final_adapter`` (written first) the adapters alone."""
    from workbench.engine.models import is_lora, save_merged

    acc = trainer.accelerator
    final = Path(trainer.run_dir) / FINAL_DIR
    if acc.is_main_process:
        model = acc.unwrap_model(trainer.policy)

        def write_final(tmp: Path) -> None:
            if is_lora(model):
                save_merged(model, tmp)
            else:
                model.save_pretrained(tmp, safe_serialization=True)
            trainer.tokenizer.save_pretrained(tmp)

        if is_lora(model):
            _replace_dir(final.with_name(FINAL_ADAPTER_DIR), lambda tmp: model.save_pretrained(tmp, safe_serialization=True))
        _replace_dir(final, write_final)
    acc.wait_for_everyone()
    return final


# -- load ------------------------------------------------------------------------------------------
def _load_adapter_weights(model, path: Path) -> None:
    """Load a LoRA checkpoint's ``adapter_model.safetensors`` into ``model`` (PEFT's own loader);
    every adapter tensor of the model must be in the file."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    from workbench.engine.models import adapter_state_dict

    file = path / ADAPTER_WEIGHTS
    if not file.is_file():
        raise CheckpointError(f"checkpoint {path} holds no {ADAPTER_WEIGHTS} (it is not a LoRA run's)")
    state = load_file(file)
    result = set_peft_model_state_dict(model, state)
    if result.unexpected_keys or len(state) != len(adapter_state_dict(model)):
        raise CheckpointError(f"checkpoint {path} does not fit this run's adapters: {len(state)} tensors for "
                              f"{len(adapter_state_dict(model))}, unexpected {list(result.unexpected_keys)[:5]}")


def _load_policy_weights(model, path: Path) -> None:
    """Load ``model*.safetensors`` of ``path`` into ``model`` (read on the CPU; load_state_dict copies
    onto the parameters' device). save_pretrained leaves out tied weights (lm_head = embeddings):
    every key it left out must share its tensor with a loaded one. A LoRA model: its adapters."""
    from safetensors.torch import load_file

    from workbench.engine.models import is_lora

    if is_lora(model):
        return _load_adapter_weights(model, path)
    state: dict = {}
    for file in sorted(path.glob("model*.safetensors")):
        state.update(load_file(file))
    if not state:
        raise CheckpointError(f"checkpoint {path} holds no model*.safetensors")
    missing, unexpected = model.load_state_dict(state, strict=False)
    current = model.state_dict()
    loaded = {t.data_ptr() for name, t in current.items() if name in state}
    untied = [k for k in missing if current[k].data_ptr() not in loaded]
    if unexpected or untied:
        raise CheckpointError(f"checkpoint {path} does not fit this run's model: missing {untied[:5]}, "
                              f"unexpected {list(unexpected)[:5]}")


def _torch_load(path: Path):
    """A state dict read on the CPU (``load_state_dict`` moves optimiser state onto its parameters'
    device; DDP on CPU names its device ``cpu:0``, which torch.load cannot map to)."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def load_checkpoint(trainer, path: Path) -> int:
    """Load a checkpoint into a set-up trainer (every rank); returns the step it was saved after."""
    from safetensors.torch import load_model

    acc = trainer.accelerator
    state = json.loads((path / STATE_FILE).read_text())
    if state["world_size"] != trainer.world:
        raise CheckpointError(f"checkpoint {path} was written by {state['world_size']} processes; resume it with "
                              f"{state['world_size']} (this run has {trainer.world})")
    _load_policy_weights(acc.unwrap_model(trainer.policy), path)
    trainer.optimizer.load_state_dict(_torch_load(path / OPTIMIZER_FILE))
    trainer.scheduler.load_state_dict(_torch_load(path / SCHEDULER_FILE))
    if getattr(acc, "scaler", None) is not None and (path / SCALER_FILE).exists():
        acc.scaler.load_state_dict(_torch_load(path / SCALER_FILE))
    if getattr(trainer, "critic", None) is not None:
        load_model(acc.unwrap_model(trainer.critic), str(path / CRITIC_FILE))
        trainer.critic_optimizer.load_state_dict(_torch_load(path / CRITIC_OPTIMIZER_FILE))
    _set_rng_state(_torch_load(path / f"rng-rank{trainer.rank}.pt"))
    trainer.state = trainer.state.restored(state)
    trainer.snapshots.clear()  # train.staleness: the deque starts afresh from the resumed weights
    trainer.snapshot_weights()
    return int(state["step"])


def resume(trainer, claim) -> int:
    """Load the checkpoint the main process chose and verified when it claimed the run directory
    (``claim.checkpoint``, :func:`choose_resume_checkpoint`; None: start at step 0) and record
    the resume with its ``warnings`` (checkpoints skipped as damaged); returns the first step to
    train. Only the main process verifies (sha256 of every file): with several processes its
    choice is broadcast to the others. Call after ``setup`` and before the first step."""
    path, warnings = claim.checkpoint, list(claim.warnings)
    if trainer.world > 1:
        from accelerate.utils import broadcast_object_list

        path, warnings = broadcast_object_list([path, warnings], from_process=0)
    start = 0 if path is None else load_checkpoint(trainer, Path(path)) + 1
    trainer.events.emit("resume", start, checkpoint=None if path is None else str(path), warnings=list(warnings))
    return start
