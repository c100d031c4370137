"""Reward functions with TRL's signature, their registry, and batch reward computation.

A reward function is any callable

    fn(prompts: list[str], completions: list[str], completion_ids: list[list[int]], **kwargs)
        -> list[float | None]

where ``kwargs`` carries the dataset's extra columns (lists aligned with ``prompts``), possibly
``trainer_state``, and TRL's two logging callables ``log_extra(column, values)`` (one value per
completion: a column of the step's samples) and ``log_metric(name, value)`` (a scalar: the mean
of the values logged in a step is the step's metric ``name``), given to every function that takes
them (a ``**kwargs`` or parameters of those names; see :class:`RewardLogs`); a ``None`` entry
means "not applicable to this sample". ``async def`` functions
are supported: :func:`compute_rewards` awaits them (concurrently). This is the signature TRL's
``GRPOTrainer`` uses, so a reward function written for TRL works here unchanged and vice versa.

Functions are referenced from recipes by a short built-in name (``exact_match``) or by an import
path ``package.module:function``; references are resolved by importing, never by evaluating code.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

from typing import TYPE_CHECKING

from workbench.engine.reasoning import REASONING_REWARDS

if TYPE_CHECKING:  # torch is imported where rewards are scored: the app lists these functions without it
    import torch

RewardFn = Callable[..., Any]

#: Built-in reward functions by short name (filled by :func:`register_reward`).
REWARD_REGISTRY: dict[str, RewardFn] = {}

# Columns the caller passes positionally; never forwarded again as keyword columns (as in TRL).
_RESERVED_COLUMNS = ("prompt", "completion", "completion_ids", "prompts", "completions", "log_extra", "log_metric")

# module.path:attr.path (identifiers only), e.g. "my_pkg.rewards:score" or "pkg.mod:Cls.method".
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_REF_PATTERN = re.compile(rf"^{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*$")


class RewardFunctionError(RuntimeError):
    """A reward function raised, or returned something that is not one reward per sample."""


#: Keys of a logged sample; an extra column may not take one of these names.
SAMPLE_KEYS = ("prompt", "completion", "reward", "advantage", "length", "truncated")
_LOGGING_KWARGS = ("log_extra", "log_metric")


class RewardLogs:
    """What reward functions logged through TRL's ``log_extra`` / ``log_metric`` (TRL 1.16
    ``GRPOTrainer._log_completion_extra`` / ``_log_metric``), for one scored batch.

    extra: column -> B values (the completions' order), shown as columns of the step's samples
        (TRL: columns of the completions table). A column logged twice in a batch keeps the last.
    metrics: name -> the values logged; the step's metric ``name`` is their mean over every rank
        (TRL: sum / count; reduced by the trainer, Trainer._reward_logged_metrics).
    """

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.extra: dict[str, list[Any]] = {}
        self.metrics: dict[str, list[float]] = {}

    def callables(self, fn_name: str) -> dict[str, Callable[..., None]]:
        """``log_extra`` and ``log_metric`` for reward function ``fn_name`` (errors name it)."""

        def log_extra(column: str, values: Sequence[Any]) -> None:
            if not isinstance(column, str) or not column or column in SAMPLE_KEYS:
                raise RewardFunctionError(f"reward function {fn_name!r}: log_extra column {column!r} must be a "
                                          f"non-empty name other than {', '.join(SAMPLE_KEYS)}")
            values = list(values)
            if len(values) != self.batch_size:
                raise RewardFunctionError(f"reward function {fn_name!r}: log_extra({column!r}) got {len(values)} "
                                          f"values; expected {self.batch_size} (one per completion)")
            # TRL's table takes "strings or any value convertible to string": keep JSON scalars, str() the rest
            self.extra[column] = [v if v is None or isinstance(v, (str, int, float, bool)) else str(v) for v in values]

        def log_metric(name: str, value: float) -> None:
            try:
                number = float(value)
            except (TypeError, ValueError):
                number = math.nan
            if not isinstance(name, str) or not name or not math.isfinite(number):
                raise RewardFunctionError(f"reward function {fn_name!r}: log_metric({name!r}, {value!r}): "
                                          "expected a non-empty name and a finite number")
            self.metrics.setdefault(name, []).append(number)

        return {"log_extra": log_extra, "log_metric": log_metric}


def _accepts_logging(fn: RewardFn) -> bool:
    """The function takes ``**kwargs`` or parameters named log_extra / log_metric."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature: give it nothing extra
        return False
    return any(p.kind is p.VAR_KEYWORD or p.name in _LOGGING_KWARGS for p in params)


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator: register ``fn`` as the built-in reward function ``name``.

    The short name is also stored on the function (``fn.reward_name``) so per-function metrics
    are reported under it (``rewards/<name>``), whatever the Python identifier is.
    """

    def decorate(fn: RewardFn) -> RewardFn:
        if name in REWARD_REGISTRY:
            raise ValueError(f"reward function {name!r} is already registered")
        fn.reward_name = name  # type: ignore[attr-defined]
        REWARD_REGISTRY[name] = fn
        return fn

    return decorate


def reward_name(fn: RewardFn) -> str:
    """The name a reward function is reported under: registry name, else ``__name__``."""
    return getattr(fn, "reward_name", None) or getattr(fn, "__name__", None) or type(fn).__name__


# --------------------------------------------------------------------------------------------
# Built-in reward functions (used by the built-in tasks in ``tasks.py``)
# --------------------------------------------------------------------------------------------

_INTEGER = re.compile(r"-?\d+")


def _column(kwargs: dict[str, Any], column: str, fn_name: str) -> list[Any]:
    """The dataset column ``column`` from a reward function's kwargs, or a clear error."""
    if column not in kwargs:
        available = sorted(k for k in kwargs if k not in ("trainer_state", *_LOGGING_KWARGS))
        raise ValueError(
            f"reward function {fn_name!r} needs a dataset column {column!r}; "
            f"the dataset has columns {available}"
        )
    return kwargs[column]


@register_reward("exact_match")
def exact_match(prompts: list[str], completions: list[str], completion_ids=None, **kwargs) -> list[float | None]:
    """1.0 where ``completion.strip() == str(answer).strip()``, else 0.0 (column ``answer``).

    A sample whose ``answer`` is None gets None (not applicable). Anything after the answer
    (the model not stopping) makes it wrong, which also teaches the model to emit EOS.
    """
    answers = _column(kwargs, "answer", "exact_match")
    return [
        None if answer is None else float(completion.strip() == str(answer).strip())
        for completion, answer in zip(completions, answers, strict=True)
    ]


@register_reward("format")
def integer_format(prompts: list[str], completions: list[str], completion_ids=None, **kwargs) -> list[float]:
    """1.0 where the stripped completion is an integer (digits with an optional leading minus).

    A partial signal for arithmetic: a wrong number in the right form beats free text. Give it
    a small weight (the ``arithmetic`` task uses 0.2) so it never outweighs correctness.
    """
    return [float(_INTEGER.fullmatch(completion.strip()) is not None) for completion in completions]


@register_reward("position_match")
def position_match(prompts: list[str], completions: list[str], completion_ids=None, **kwargs) -> list[float | None]:
    """Fraction of character positions where the stripped completion equals ``target``.

    reward = #{i : completion[i] == target[i]} / max(len(target), len(completion)), in [0, 1].
    Dividing by the longer of the two penalises both missing and extra characters, so the
    reward is graded (dense) and only 1.0 for the exact target. Empty/None target -> None.
    """
    targets = _column(kwargs, "target", "position_match")
    rewards: list[float | None] = []
    for completion, target in zip(completions, targets, strict=True):
        if not target:
            rewards.append(None)
            continue
        target, completion = str(target), completion.strip()
        hits = sum(c == t for c, t in zip(completion, target))
        rewards.append(hits / max(len(target), len(completion)))
    return rewards


@register_reward("first_char")
def first_char(prompts: list[str], completions: list[str], completion_ids=None, **kwargs) -> list[float | None]:
    """1.0 where the completion's first character equals ``letter``, whatever follows.

    The reward is deliberately independent of completion length (see the ``length_probe``
    task). No stripping: the very first character counts. Empty/None letter -> None.
    """
    letters = _column(kwargs, "letter", "first_char")
    return [
        None if not letter else float(completion[:1] == str(letter)[:1])
        for completion, letter in zip(completions, letters, strict=True)
    ]


# The reasoning-gym verifier, the <answer> format reward and math-verify (engine/reasoning.py,
# which imports reasoning-gym and math-verify only when a reward is computed).
for _name, _fn in REASONING_REWARDS.items():
    register_reward(_name)(_fn)


# --------------------------------------------------------------------------------------------
# Resolving references
# --------------------------------------------------------------------------------------------


def load_reward_function(ref: str) -> RewardFn:
    """Resolve a built-in short name or an import reference ``package.module:function``.

    Only importing is done (``importlib.import_module`` + attribute lookup); the reference is
    never evaluated. Raises ValueError naming ``ref`` and what is allowed when it is malformed,
    its module cannot be imported, the attribute is missing, or the object is not callable.
    """
    allowed = (
        f"a built-in reward name ({', '.join(sorted(REWARD_REGISTRY))}) "
        "or an import reference 'package.module:function'"
    )
    if not isinstance(ref, str):
        raise ValueError(f"reward function reference {ref!r} is not a string; expected {allowed}")
    ref = ref.strip()
    if ref in REWARD_REGISTRY:
        return REWARD_REGISTRY[ref]
    if not _REF_PATTERN.fullmatch(ref):
        raise ValueError(f"reward function reference {ref!r} is not valid; expected {allowed}")
    module_name, attr_path = ref.split(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"reward function reference {ref!r}: module {module_name!r} cannot be imported ({exc}); "
            f"expected {allowed} with the module importable from the run's Python path"
        ) from exc
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise ValueError(
                f"reward function reference {ref!r}: {module_name!r} has no attribute {attr_path!r}"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(
            f"reward function reference {ref!r} points to a {type(obj).__name__}, which is not callable"
        )
    return obj


def is_import_reference(ref: str) -> bool:
    """``ref`` has the shape of an import reference 'package.module:function' (nothing imported)."""
    return isinstance(ref, str) and bool(_REF_PATTERN.fullmatch(ref))


def app_reward_choices(allowed: Sequence[str] = ()) -> tuple[str, ...]:
    """The reward functions the app offers: the built-ins, then the import references an admin
    allowed (settings ``reward_funcs_allowed``). In the app the person typing does not own the
    server, and importing a module runs its top-level code; the CLI keeps Python's import rules."""
    return (*sorted(REWARD_REGISTRY), *[r for r in allowed if r not in REWARD_REGISTRY])


def check_app_reward_funcs(refs: Sequence[str], allowed: Sequence[str] = ()) -> None:
    """Refuse, before anything is imported, a reference the app does not offer (ValueError
    naming reward_funcs, the reference and what is allowed)."""
    choices = app_reward_choices(allowed)
    for ref in refs:
        if ref not in choices:
            shown = repr(ref)[:80]
            raise ValueError(f"reward_funcs={shown} is not allowed in the app; allowed: {', '.join(choices)} "
                             "(an admin adds import references to reward_funcs_allowed in settings.yaml)")


# --------------------------------------------------------------------------------------------
# Computing rewards for a batch
# --------------------------------------------------------------------------------------------


def _run_coroutines(coros: list[Any]) -> list[Any]:
    """Await ``coros`` concurrently; results (or the exceptions raised) in order.

    Uses a fresh event loop; when this thread already runs one (a notebook, an async server),
    the loop runs in a helper thread instead, since ``asyncio.run`` cannot nest.
    """

    async def gather() -> list[Any]:
        return await asyncio.gather(*coros, return_exceptions=True)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(gather())
    box: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: box.update(result=asyncio.run(gather())))
    thread.start()
    thread.join()
    return box["result"]


def _as_rewards(name: str, result: Any, batch_size: int) -> list[float]:
    """Validate one function's output -> B floats (None -> NaN), else RewardFunctionError."""
    if type(result).__module__ == "torch" and hasattr(result, "tolist"):  # a tensor (torch.Tensor)
        result = result.tolist()
    if isinstance(result, (str, bytes, dict)) or not hasattr(result, "__len__"):
        raise RewardFunctionError(
            f"reward function {name!r} returned {type(result).__name__}; expected a list of "
            f"{batch_size} floats (or None)"
        )
    values = list(result)
    if len(values) != batch_size:
        raise RewardFunctionError(
            f"reward function {name!r} returned {len(values)} rewards; expected {batch_size} "
            "(one per completion)"
        )
    rewards = []
    for index, value in enumerate(values):
        if value is None:
            rewards.append(math.nan)
            continue
        try:
            reward = float(value)
        except (TypeError, ValueError) as exc:
            raise RewardFunctionError(
                f"reward function {name!r} returned {value!r} at index {index}; expected a float or None"
            ) from exc
        if math.isinf(reward):  # NaN is TRL's "no reward" (like None); an infinity is a bug in the function
            raise RewardFunctionError(
                f"reward function {name!r} returned {reward} at index {index}; expected a finite float or None")
        rewards.append(reward)
    return rewards


def _unique_names(funcs: Sequence[RewardFn]) -> list[str]:
    """Reporting names, de-duplicated with a numeric suffix (``name``, ``name_2``, ...)."""
    names: list[str] = []
    for fn in funcs:
        base = name = reward_name(fn)
        k = 2
        while name in names:
            name, k = f"{base}_{k}", k + 1
        names.append(name)
    return names


def reward_weights_for(weights: Sequence[float] | None, names: Sequence[str]) -> list[float]:
    """One float weight per reward function named in ``names`` (None: 1.0 each). The one check
    that the lengths agree: the trainer calls it when the run starts (so a bad recipe fails before
    any model is loaded) and :func:`compute_rewards` on every batch."""
    if weights is None:
        return [1.0] * len(names)
    if len(weights) != len(names):
        raise ValueError(
            f"reward_weights has {len(weights)} values for {len(names)} reward functions "
            f"({', '.join(names)}): give one weight per function"
        )
    return [float(w) for w in weights]


def compute_rewards(
    funcs: Sequence[RewardFn],
    weights: Sequence[float] | None,
    prompts: list[str],
    completions: list[str],
    completion_ids: list[list[int]],
    columns: dict[str, list[Any]],
    *,
    trainer_state: Any = None,
    logs: RewardLogs | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Score a batch with every reward function and combine them.

    Args:
        funcs: F reward functions (TRL signature, sync or async).
        weights: F weights, or None for all 1.0.
        prompts, completions, completion_ids: B items each.
        columns: extra dataset columns, each a list of B values, passed as keyword arguments
            (``prompt``/``completion``/``completion_ids`` keys are dropped, as in TRL).
        trainer_state: forwarded as ``trainer_state=`` when not None.
        logs: collects what the functions log through ``log_extra`` / ``log_metric`` (passed to
            each function that accepts them); None = a throwaway collector.

    Returns:
        total: (B,) float32, ``nansum_f(weight_f * reward_f)``: a None reward contributes
            nothing, and a sample where every function returned None gets 0 (as in TRL).
        per_function: name -> (B,) float32 raw (unweighted) rewards, NaN where None.

    Raises:
        RewardFunctionError naming the function when one raises (original exception chained)
        or returns the wrong number of rewards; ValueError for misaligned inputs.
    """
    import torch

    batch_size = len(prompts)
    if len(completions) != batch_size or len(completion_ids) != batch_size:
        raise ValueError(
            f"prompts, completions and completion_ids must align: got {batch_size}, "
            f"{len(completions)}, {len(completion_ids)}"
        )
    names = _unique_names(funcs)
    weights = reward_weights_for(weights, names)
    kwargs = {k: list(v) for k, v in columns.items() if k not in _RESERVED_COLUMNS}
    for key, values in kwargs.items():
        if len(values) != batch_size:
            raise ValueError(f"column {key!r} has {len(values)} values; expected {batch_size}")
    if trainer_state is not None:
        kwargs["trainer_state"] = trainer_state

    logs = RewardLogs(batch_size) if logs is None else logs
    results: list[Any] = [None] * len(funcs)
    pending: dict[int, Any] = {}  # index -> coroutine of an async reward function
    for i, (name, fn) in enumerate(zip(names, funcs)):
        logging_kwargs = logs.callables(name) if _accepts_logging(fn) else {}
        try:
            out = fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs, **logging_kwargs)
        except Exception as exc:
            for awaitable in pending.values():  # avoid "coroutine was never awaited" warnings
                getattr(awaitable, "close", lambda: None)()
            raise RewardFunctionError(f"reward function {name!r} raised {type(exc).__name__}: {exc}") from exc
        if inspect.isawaitable(out):
            pending[i] = out
        else:
            results[i] = out
    if pending:
        for i, out in zip(pending, _run_coroutines(list(pending.values()))):
            if isinstance(out, BaseException):
                raise RewardFunctionError(
                    f"reward function {names[i]!r} raised {type(out).__name__}: {out}"
                ) from out
            results[i] = out

    per_function = {
        name: torch.tensor(_as_rewards(name, out, batch_size), dtype=torch.float32)
        for name, out in zip(names, results)
    }
    if not funcs:
        return torch.zeros(batch_size), per_function
    stacked = torch.stack(list(per_function.values()))  # (F, B)
    weight = torch.tensor(weights, dtype=torch.float32).unsqueeze(1)  # (F, 1)
    total = torch.nansum(stacked * weight, dim=0)  # (B,); all-NaN column -> 0
    return total, per_function
