"""The built-in model ``tiny``: a ~0.8M-parameter Llama with a character-level tokenizer.

It exists so that every default works with no network and no GPU: it is built on first use by a
deterministic script (fixed seed, one CPU thread) and cached under
``<workbench home>/models/tiny-v1``. The build is a short supervised warm-up (teacher forcing on
prompt + reference completion + EOS, loss on the completion tokens only) on rows from the
built-in task generators, so that sampling at temperature 1.0 earns a clearly non-zero but far
from perfect verifiable reward and RL has room to improve.

Loading it (and any other model) goes through ``workbench.engine.models.load_policy``.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from workbench.engine.tasks import Row, get_task
from workbench.engine.seeds import warmup_data_seed
from workbench.home import confined_path, workbench_home
from workbench.model_facts import TINY_MAX_POSITIONS

#: Cache directory name; bump the suffix whenever the build recipe below changes.
TINY_VERSION = "tiny-v1"

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD, BOS, EOS, UNK = SPECIAL_TOKENS
#: Every character the tokenizer knows (after the special tokens, in id order).
ALPHABET = (
    "0123456789"
    "abcdefghijklmnopqrstuvwxyz"
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    " +-*=?:.,()<>/!'\"_#%;[]{}&|^~@$\\`\n"
)
MAX_POSITIONS = TINY_MAX_POSITIONS  # one definition, which recipe validation reads without torch

# Architecture: 4 x (attention 4*128*128 + MLP 3*128*352) + tied embeddings ~= 0.81M parameters.
MODEL_SHAPE = dict(
    hidden_size=128,
    intermediate_size=352,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=MAX_POSITIONS,
    tie_word_embeddings=True,
)

# Warm-up: rows per batch from each task. Arithmetic dominates because it is the slowest to learn
# and the default task whose reward must start non-zero; the others get just enough to emit
# well-formed, partly right completions (leaving RL room to improve them).
WARMUP_MIX = {"arithmetic": 48, "reverse": 8, "length_probe": 8}
WARMUP_LR = 3e-3
DEFAULT_WARMUP_STEPS = 200
METADATA_FILE = "workbench_tiny.json"


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per character of ``ALPHABET``, no merges.

    Every character is its own pre-token (``Split`` on any single character, newline included)
    looked up in a ``WordLevel`` vocabulary; the ``Fuse`` decoder joins tokens with nothing in
    between, so ``decode(encode(s)) == s`` for any ``s`` over the alphabet (unknown characters
    become ``<unk>``). No BOS/EOS is added on encode: prompts are encoded the same way during
    warm-up and generation. Padding is on the left, as generation needs.
    """
    vocab = {token: index for index, token in enumerate((*SPECIAL_TOKENS, *ALPHABET))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,  # never insert or remove spaces around punctuation
        model_max_length=MAX_POSITIONS,
    )


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


def build_config(tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
    """The tiny Llama config (Llama, not Qwen2: a Qwen2 config makes transformers swap tokenizers)."""
    return LlamaConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **MODEL_SHAPE,
    )


def _pad_right(rows: list[Row], tokenizer: PreTrainedTokenizerBase) -> tuple[torch.Tensor, ...]:
    """Teacher-forcing tensors for ``prompt + reference + <eos>``, right-padded.

    Labels are -100 on the prompt and padding, so the loss covers the completion and the EOS
    (the model learns to stop).

    Returns:
        input_ids (B, T) long, attention_mask (B, T) long, labels (B, T) long.
    """
    sequences, labels = [], []
    for row in rows:
        prompt = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        completion = tokenizer(row["reference"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        sequences.append(prompt + completion)
        labels.append([-100] * len(prompt) + completion)
    width = max(map(len, sequences))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([seq + [pad] * (width - len(seq)) for seq in sequences])
    attention_mask = torch.tensor([[1] * len(seq) + [0] * (width - len(seq)) for seq in sequences])
    label_ids = torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels])
    return input_ids, attention_mask, label_ids


def warmup_batches(
    tokenizer: PreTrainedTokenizerBase, step: int, seed: int, mix: dict[str, int] | None = None
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """One warm-up step's data: a sub-batch per task, drawn from the built-in task generators.

    Sub-batches are padded separately because arithmetic rows (most of the batch) are half as
    long as the others: one shared width would spend ~40% of the compute on padding.

    Returns:
        per task in ``mix`` (name order): input_ids, attention_mask, labels, each (B_task, T_task).
    """
    batches = []
    for offset, (name, count) in enumerate(sorted((mix or WARMUP_MIX).items())):
        # A distinct, reproducible generator seed per (build seed, step, task).
        rows = get_task(name).make_dataset(count, warmup_data_seed(seed, step, offset))
        if rows:
            batches.append(_pad_right(rows, tokenizer))
    return batches


def _summed_token_loss(model: torch.nn.Module, input_ids, attention_mask, labels) -> tuple[torch.Tensor, int]:
    """Next-token cross-entropy summed over labelled tokens, and their count.

    Shapes: input_ids/attention_mask/labels (B, T) -> (scalar, int).
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]  # (B, T-1, V)
    targets = labels[:, 1:]  # position t predicts token t+1
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100, reduction="sum")
    return loss, int((targets != -100).sum())


def _learning_rate(step: int, total: int, peak: float = WARMUP_LR) -> float:
    """Linear warm-up over 5% of steps, then cosine decay to 10% of ``peak``."""
    ramp = max(1, total // 20)
    if step < ramp:
        return peak * (step + 1) / ramp
    progress = (step - ramp) / max(1, total - ramp)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@contextmanager
def _single_thread() -> Iterator[None]:
    """One intra-op thread (deterministic, and fastest on 2-core machines); restored after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def train_tiny_model(
    tokenizer: PreTrainedTokenizerBase, *, seed: int, warmup_steps: int
) -> tuple[LlamaForCausalLM, list[float]]:
    """Initialise the tiny Llama from ``seed`` and run the supervised warm-up.

    Deterministic: seeded init, seeded data, one thread; the caller's RNG state is preserved.
    Returns the model (eval mode) and the loss of every step.
    """
    losses: list[float] = []
    with torch.random.fork_rng(devices=[]), _single_thread():
        torch.manual_seed(seed)
        config = build_config(tokenizer)
        config._attn_implementation = "eager"  # ~20% faster than sdpa for these tiny shapes on CPU
        model = LlamaForCausalLM(config)
        model.generation_config = GenerationConfig(
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=WARMUP_LR, betas=(0.9, 0.98), weight_decay=0.0)
        model.train()
        for step in range(warmup_steps):
            for group in optimizer.param_groups:
                group["lr"] = _learning_rate(step, warmup_steps)
            # Mean over every labelled token of the step, accumulated over the task sub-batches.
            optimizer.zero_grad(set_to_none=True)
            sums, counts = zip(*(_summed_token_loss(model, *batch) for batch in warmup_batches(tokenizer, step, seed)))
            loss = torch.stack(sums).sum() / sum(counts)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
    model.eval()
    return model, losses


# --------------------------------------------------------------------------------------------
# Building and caching
# --------------------------------------------------------------------------------------------


def _replace_dir(new: Path, target: Path) -> None:
    """Move the finished ``new`` into place as ``target`` (renames only: never half-written)."""
    if not target.exists():
        os.rename(new, target)
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.rename(target, retired / target.name)
    os.rename(new, target)
    shutil.rmtree(retired, ignore_errors=True)


def build_tiny_model(out_dir: Path, *, seed: int = 0, warmup_steps: int = DEFAULT_WARMUP_STEPS) -> Path:
    """Build the tiny model + tokenizer deterministically into ``out_dir`` and return it.

    Everything is written into a temporary sibling directory first and renamed into place at
    the end, so a crash never leaves a half-built ``out_dir``. An existing ``out_dir`` is
    replaced. Files: ``config.json``, ``model.safetensors``, ``generation_config.json``, the
    tokenizer files, and ``workbench_tiny.json`` (seed, steps, losses, build time).
    """
    out_dir = Path(out_dir).expanduser().resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    tokenizer = build_tokenizer()
    model, losses = train_tiny_model(tokenizer, seed=seed, warmup_steps=warmup_steps)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        metadata = {
            "name": TINY_VERSION,
            "seed": seed,
            "warmup_steps": warmup_steps,
            "warmup_mix": WARMUP_MIX,
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "first_loss": losses[0] if losses else None,
            "final_loss": losses[-1] if losses else None,
            "build_seconds": round(time.perf_counter() - started, 2),
            "torch": torch.__version__,
        }
        (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
        staging.chmod(0o755)  # mkdtemp makes it 0700; the cache is meant to be shared read-only
        _replace_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive ``flock`` on ``path`` (created if missing), held for the ``with`` block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _is_built(path: Path) -> bool:
    """The cache is complete: the metadata file is written last, inside the renamed directory."""
    return (path / METADATA_FILE).is_file() and (path / "config.json").is_file()


def ensure_tiny_model(home: Path | None = None) -> Path:
    """``<workbench home>/models/tiny-v1``, built on first use.

    Safe under concurrency: builders serialise on a ``flock`` and re-check after acquiring it,
    so two processes asking at once build once; stale temporary directories left by a crashed
    build are removed while holding the lock.
    """
    root = Path(home).expanduser().resolve() if home is not None else workbench_home()
    target = confined_path(f"models/{TINY_VERSION}", root=root, field="model")
    if _is_built(target):
        return target
    with _file_lock(target.parent / f".{TINY_VERSION}.lock"):
        if _is_built(target):  # another process finished while we waited
            return target
        for stale in target.parent.glob(f".{TINY_VERSION}.*-*"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        return build_tiny_model(target)
