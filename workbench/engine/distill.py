"""The teacher of on-policy distillation: where it comes from, that it speaks the student's tokens,
and loading it (core.distillation holds the maths).

A recipe's ``teacher.model`` (recipe.teacher_reference checked its form) is

- ``tiny-teacher``: the built-in tiny model trained longer, by the ``grpo`` preset on its own task
  (arithmetic_four) for ``TINY_TEACHER_STEPS`` steps, seed 0. Built on first use in a child process
  (``python -m workbench train``, so the parent's RNGs, accelerate state and signals are untouched,
  and under ``accelerate launch`` every rank just waits for one build) and cached under
  ``<workbench home>/models/tiny-teacher-<key>`` (key: the tiny model's version and the teacher's
  recipe); ``python -m workbench model build tiny-teacher`` builds it ahead of time;
- any model reference ``model:`` accepts (a run's ``final/`` directory, a built-in, a hub id).

Distillation compares log-probs of the same token ids, so the teacher's tokenizer must be the
student's: same vocabulary (token -> id), same special tokens, same ids for a probe string.
:func:`check_teacher` says so in one line naming both models before anything trains. Nothing here
imports torch at module level.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from filelock import FileLock

from workbench.engine.events import read_events
from workbench.model_facts import TINY_MODEL, models_dir
from workbench.recipe import TINY_TEACHER, Recipe, load_recipe

#: Steps of the grpo preset that make the built-in teacher (the preset itself runs 60): on
#: arithmetic_four the reward is near its ceiling by then (see tests/engine/test_distill.py).
TINY_TEACHER_STEPS = 150
TEACHER_MARKER = "workbench_teacher.json"  # written before the rename: its presence marks a complete build
#: Text whose token ids the two tokenizers must agree on (digits, operators, letters, spaces, non-ASCII).
PROBE_TEXT = "3+2=5\n7-4=3 The quick brown fox, 12345 rev:abcd= dcba; café Ω"
#: Environment of an accelerate / torch.distributed process: the teacher's build is a plain single process.
DISTRIBUTED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                   "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


class TeacherError(ValueError):
    """A teacher that cannot teach this student (one line for the user)."""


# ---- the built-in teacher ---------------------------------------------------------------------


def tiny_teacher_recipe() -> Recipe:
    """The recipe that trains the built-in teacher: the grpo preset, longer, logging little."""
    return load_recipe("grpo", [f"name={TINY_TEACHER}", f"model={TINY_MODEL}", f"train.steps={TINY_TEACHER_STEPS}",
                                "train.seed=0", "logging.samples_per_step=0", "logging.diagnostics_every=0"])


def tiny_teacher_dir(home: Path | None = None) -> Path:
    """``<home>/models/tiny-teacher-<key>``; a changed recipe or tiny model gets a fresh cache."""
    from workbench.engine.tiny import TINY_VERSION

    key = hashlib.sha256(f"{TINY_VERSION}\0{tiny_teacher_recipe().to_yaml()}".encode()).hexdigest()[:12]
    return models_dir(home) / f"{TINY_TEACHER}-{key}"


def ensure_tiny_teacher(home: Path | None = None) -> Path:
    """The built-in teacher's HF directory, trained first if it is not cached (~1 min on 2 cores).

    Concurrent callers serialise on a file lock and re-check after it; the child run writes into a
    temporary sibling whose ``final/`` is renamed into place once complete. A failed build raises
    RuntimeError with the tail of the child's log and leaves nothing behind.
    """
    target = tiny_teacher_dir(home)
    if (target / TEACHER_MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if (target / TEACHER_MARKER).is_file():
            return target
        for stale in target.parent.glob(f".{target.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            final = _train_teacher(staging, home)
            final.chmod(0o755)
            os.rename(final, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _train_teacher(staging: Path, home: Path | None) -> Path:
    """Run the teacher's recipe in a child process into ``staging/run``; returns its final/ with the marker."""
    recipe = tiny_teacher_recipe()
    (staging / "recipe.yaml").write_text(recipe.to_yaml())
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV and not k.startswith("ACCELERATE_")}
    if home is not None:
        env["WORKBENCH_HOME"] = str(Path(home).expanduser().resolve())
    log = staging / "train.log"
    with log.open("w") as out:
        code = subprocess.run([sys.executable, "-m", "workbench", "train", str(staging / "recipe.yaml"),
                               "--run-dir", str(staging / "run")], stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    final = staging / "run" / "final"
    if code != 0 or not (final / "config.json").is_file():
        tail = " | ".join(log.read_text().strip().splitlines()[-3:])
        raise RuntimeError(f"building {TINY_TEACHER} failed (exit {code}): {tail}")
    rewards = [e["metrics"]["reward"] for e in read_events(staging / "run") if e["kind"] == "metrics"]
    (final / TEACHER_MARKER).write_text(json.dumps(
        {"recipe": recipe.to_dict(), "reward_first_10": _mean(rewards[:10]), "reward_last_10": _mean(rewards[-10:])}, indent=2) + "\n")
    return final


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


# ---- any teacher ------------------------------------------------------------------------------


def resolve_teacher(reference: str, home: Path | None = None) -> str:
    """The directory (or hub id) ``from_pretrained`` reads for a teacher reference."""
    from workbench.engine.models import resolve_model

    return str(ensure_tiny_teacher(home)) if reference == TINY_TEACHER else resolve_model(reference, home=home)


def _tokenizer_source(reference: str, home: Path | None = None) -> str:
    """Where the teacher's tokenizer is: the built-in teacher was trained from the tiny model and
    keeps its tokenizer, so checking it needs no build."""
    from workbench.engine.models import resolve_model

    return resolve_model(TINY_MODEL, home=home) if reference == TINY_TEACHER else resolve_teacher(reference, home)


def tokenizer_difference(student: Any, teacher: Any) -> str | None:
    """How two tokenizers differ in what distillation needs (None if they agree): the vocabulary
    (token -> id, added tokens included), the special tokens, and the ids of ``PROBE_TEXT``."""
    s_vocab, t_vocab = student.get_vocab(), teacher.get_vocab()
    if s_vocab != t_vocab:
        differ = sorted(set(s_vocab.items()) ^ set(t_vocab.items()))[:1]
        example = f", e.g. {differ[0][0]!r}" if differ else ""
        return f"vocabularies differ ({len(s_vocab)} vs {len(t_vocab)} tokens{example})"
    s_special, t_special = _special_tokens(student), _special_tokens(teacher)
    if s_special != t_special:
        return f"special tokens differ ({s_special} vs {t_special})"
    s_ids, t_ids = student(PROBE_TEXT)["input_ids"], teacher(PROBE_TEXT)["input_ids"]
    if s_ids != t_ids:
        return f"the probe text {PROBE_TEXT[:12]!r}... encodes to different ids ({s_ids[:6]} vs {t_ids[:6]})"
    return None


def _special_tokens(tokenizer: Any) -> dict[str, tuple[str, int]]:
    """bos / eos / unk (and the like) -> (token, id), as the tokenizer declares them (the pad token is
    left out: load_policy sets it to EOS where a model ships none)."""
    tokens = {k: v for k, v in tokenizer.special_tokens_map.items() if k != "pad_token" and isinstance(v, str)}
    return {k: (v, tokenizer.convert_tokens_to_ids(v)) for k, v in sorted(tokens.items())}


def check_teacher(recipe: Recipe, student_tokenizer: Any = None, home: Path | None = None) -> None:
    """TeacherError (one line naming both models) unless the recipe's teacher shares the student's
    tokenizer. Loads tokenizers only (no weights; the built-in teacher is not built for this)."""
    if not recipe.teacher.enabled:
        return
    from transformers import AutoTokenizer

    from workbench.engine.models import resolve_model

    teacher = recipe.teacher.model
    try:
        teacher_tok = AutoTokenizer.from_pretrained(_tokenizer_source(teacher, home))
        student_tok = student_tokenizer or AutoTokenizer.from_pretrained(resolve_model(recipe.model, home=home))
    except OSError as err:
        raise TeacherError(f"teacher.model={teacher!r}: its tokenizer could not be loaded ({str(err).splitlines()[0]})") from None
    difference = tokenizer_difference(student_tok, teacher_tok)
    if difference is not None:
        raise TeacherError(
            f"teacher.model={teacher!r} does not share the tokenizer of model={recipe.model!r}: {difference}; "
            "on-policy distillation compares both models' log-probs of the same token ids, so use a teacher "
            "with the student's tokenizer")


def load_teacher(recipe: Recipe, student_tokenizer: Any, device: Any = "cpu"):
    """The recipe's teacher, checked against the student's tokenizer, in eval mode without gradients."""
    from workbench.engine.models import load_policy

    check_teacher(recipe, student_tokenizer)
    model, _ = load_policy(resolve_teacher(recipe.teacher.model), device=device)
    return model.eval().requires_grad_(False)
