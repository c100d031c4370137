"""Reasoning tasks from PyPI ``reasoning-gym`` (procedural, offline, each with its verifier).

``task: reasoning_gym/<name>`` with ``<name>`` any of reasoning-gym's 100+ datasets
(``basic_arithmetic``, ``countdown``, ...) and its config keys as ``task_config`` (everything but
``size`` and ``seed``, which the workbench sets).

Rows are in TRL's conversational format: ``prompt`` = [system message asking for the answer
inside ``<answer>...</answer>`` (reasoning-gym's own ``SYSTEM_PROMPTS["default"]``), user
message = the question], plus the columns the reward functions read: ``question``, ``answer``,
``metadata`` (the reasoning-gym entry), ``rg_config`` (the dataset config, which a few verifiers
consult) and ``reference`` (one correct completion, ``<answer>gold</answer>``).

Splits: reasoning-gym seeds row ``i`` of a dataset with ``Random(seed + i)``, so datasets with
nearby seeds share rows. The train split draws from ``seed``, the eval split from
``seed + EVAL_SEED_OFFSET`` (offset far beyond any split size), and :func:`ReasoningGymTask.splits`
also drops train rows whose question text occurs in the eval split, so held-out really is
held out even for tasks with a small question space.

Reward functions use TRL's signature ``fn(completions, **columns) -> list[float | None]`` and
need nothing but the dataset columns, so they also work unchanged inside TRL's GRPOTrainer:

- ``reasoning_gym``: the dataset's verifier ``score_answer(extracted, entry)`` on the content of
  the last ``<answer>...</answer>`` (reasoning-gym's ``extract_answer``); no tag -> 0.0;
- ``answer_format``: 1.0 when the completion ends with exactly one non-empty answer block;
- ``math_verify``: math-verify's ``verify(parse(gold), parse(extracted))`` for maths answers
  (equivalent forms count: ``1/2`` = ``0.5``); unparseable gold -> None (skipped, as in TRL).
- ``final_number``: 1.0 when the last number of the reply equals the gold answer (no tags: for
  models too small to keep the answer format, e.g. SmolLM2-135M); gold not a number -> None.

Importing this module is cheap (no torch, reasoning-gym imported when first needed).
"""

from __future__ import annotations

import difflib
import functools
import json
import re
import threading
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from workbench.recipe import REASONING_GYM_PREFIX

Row = dict[str, Any]

#: Eval rows come from seed + this: row i uses Random(seed + i), so any split shorter than the
#: offset draws random streams disjoint from the train split's.
EVAL_SEED_OFFSET = 1_000_000_000
#: Keys of a reasoning-gym config that the workbench sets itself.
RESERVED_CONFIG_KEYS = ("size", "seed")
#: Default weight of ``answer_format`` beside the verifier (a partial signal, never the goal).
DEFAULT_FORMAT_WEIGHT = 0.2
#: How many rows past ``n`` the train split may scan to replace questions that the eval split holds.
_MAX_SCAN_FACTOR = 10

OPEN_TAG, CLOSE_TAG = "<answer>", "</answer>"


# --------------------------------------------------------------------------------------------
# Names and configs
# --------------------------------------------------------------------------------------------


def is_reasoning_gym_task(task: str | None) -> bool:
    """``task`` names a reasoning-gym dataset (``reasoning_gym/<name>``)."""
    return isinstance(task, str) and task.startswith(REASONING_GYM_PREFIX)


def reasoning_gym_names() -> list[str]:
    """Every dataset reasoning-gym registers, sorted."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def _dataset_name(task: str) -> str:
    """``reasoning_gym/<name>`` -> ``<name>``, or ValueError naming the field and close matches."""
    name = task[len(REASONING_GYM_PREFIX):] if is_reasoning_gym_task(task) else task
    names = reasoning_gym_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3) or names[:3]
        raise ValueError(
            f"task={task!r}: reasoning-gym has no dataset {name!r}; allowed: reasoning_gym/<name> with one "
            f"of its {len(names)} datasets (e.g. {', '.join(close)})"
        )
    return name


def _config_fields(name: str) -> list[str]:
    import dataclasses

    from reasoning_gym.factory import DATASETS

    return [f.name for f in dataclasses.fields(DATASETS[name][1]) if f.name not in RESERVED_CONFIG_KEYS]


def create_procedural_dataset(name: str, config: dict[str, Any], *, size: int, seed: int):
    """reasoning-gym's ``create_dataset(name, **config, size=, seed=)``; a bad config key or
    value raises ValueError naming ``task_config``, the value and the keys allowed."""
    import reasoning_gym

    reserved = sorted(set(config) & set(RESERVED_CONFIG_KEYS))
    if reserved:
        raise ValueError(
            f"task_config sets {', '.join(reserved)} for reasoning_gym/{name}; the workbench sets those "
            "(split sizes, train.seed): remove them"
        )
    try:
        return reasoning_gym.create_dataset(name, **config, size=size, seed=seed)
    except (TypeError, AssertionError, ValueError) as exc:
        raise ValueError(
            f"task_config={config!r} is not valid for reasoning_gym/{name} ({exc}); allowed keys: "
            f"{', '.join(_config_fields(name))}"
        ) from None


def default_system_prompt() -> str:
    """reasoning-gym's default instruction: think step by step, answer inside <answer> tags."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    return SYSTEM_PROMPTS["default"]


# --------------------------------------------------------------------------------------------
# The task
# --------------------------------------------------------------------------------------------


def entry_row(entry: dict[str, Any], config: dict[str, Any], system_prompt: str) -> Row:
    """One reasoning-gym entry -> a conversational row with the columns the rewards read."""
    return {
        "prompt": [{"role": "system", "content": system_prompt}, {"role": "user", "content": entry["question"]}],
        "question": entry["question"],
        "answer": entry["answer"],
        "metadata": entry["metadata"],
        "rg_config": dict(config),
        "reference": f"{OPEN_TAG}{entry['answer']}{CLOSE_TAG}",
    }


@dataclass(frozen=True)
class ReasoningGymTask:
    """``reasoning_gym/<name>``: prompts from reasoning-gym, its verifier as the reward.

    Attributes:
        name: the recipe value, ``reasoning_gym/<dataset>``.
        dataset: the reasoning-gym dataset name.
        config: its config keys (validated on construction).
        format_weight: weight of ``answer_format`` beside the verifier (0 drops it).
        system_prompt: the system message of every prompt (default: reasoning-gym's).
    """

    name: str
    dataset: str
    config: dict[str, Any] = field(default_factory=dict)
    format_weight: float = DEFAULT_FORMAT_WEIGHT
    system_prompt: str = ""

    @property
    def description(self) -> str:
        return f"reasoning-gym {self.dataset}: procedural prompts, scored by its verifier on the <answer> block"

    @property
    def reward_funcs(self) -> tuple[str, ...]:
        """Reward function names (registered by ``rewards.py`` from :data:`REASONING_REWARDS`)."""
        return ("reasoning_gym", "answer_format") if self.format_weight else ("reasoning_gym",)

    @property
    def reward_weights(self) -> tuple[float, ...]:
        return (1.0, float(self.format_weight)) if self.format_weight else (1.0,)

    @property
    def correct_reward(self) -> str:
        """The verifier: a completion is correct when it scores 1.0 (held-out pass@k)."""
        return "reasoning_gym"

    def reward_functions(self) -> list:
        """The reward callables, in the order of :attr:`reward_weights`."""
        return [REASONING_REWARDS[name] for name in self.reward_funcs]

    def _rows(self, n: int, seed: int, skip_questions: frozenset[str] = frozenset()) -> list[Row]:
        """The first ``n`` rows of the stream ``seed`` whose question is not in ``skip_questions``."""
        limit = n + (_MAX_SCAN_FACTOR * n + 100 if skip_questions else 0)
        data = create_procedural_dataset(self.dataset, self.config, size=max(limit, 1), seed=seed)
        rows: list[Row] = []
        for i in range(limit):
            if len(rows) == n:
                break
            entry = data[i]
            if entry["question"] not in skip_questions:
                rows.append(entry_row(entry, self.config, self.system_prompt))
        if len(rows) < n:
            raise ValueError(
                f"task={self.name!r}: only {len(rows)} of {n} train questions differ from the eval split's; "
                "widen task_config or use fewer rows"
            )
        return rows

    def splits(self, n_train: int, n_eval: int, seed: int) -> tuple[list[Row], list[Row]]:
        """(train rows, eval rows): eval from ``seed + EVAL_SEED_OFFSET``, train from ``seed``
        without any question the eval rows hold. Both deterministic in ``seed``."""
        if max(n_train, n_eval) > EVAL_SEED_OFFSET // (_MAX_SCAN_FACTOR + 1):
            raise ValueError(f"split sizes {n_train}/{n_eval} are too large for disjoint seed streams")
        eval_rows = self._rows(n_eval, seed + EVAL_SEED_OFFSET)
        held_out = frozenset(row["question"] for row in eval_rows)
        return self._rows(n_train, seed, held_out), eval_rows

    def make_dataset(self, n: int, seed: int) -> list[Row]:
        """``n`` train rows (the built-in Task interface); use :meth:`splits` when evaluating."""
        return self.splits(n, 0, seed)[0]


def reasoning_gym_task(
    task: str, config: dict[str, Any] | None = None, *, format_weight: float = DEFAULT_FORMAT_WEIGHT,
    system_prompt: str | None = None,
) -> ReasoningGymTask:
    """The task for ``task = "reasoning_gym/<name>"`` with ``config``; ValueError (one line naming
    the field, the value and what is allowed) for an unknown dataset or a bad config. Imports
    reasoning-gym, not torch: the recipe validator can call it."""
    name = _dataset_name(task)
    config = dict(config or {})
    create_procedural_dataset(name, config, size=1, seed=0)  # validate now, not mid-run
    if not 0.0 <= format_weight < float("inf"):
        raise ValueError(f"format_weight={format_weight!r} must be a finite number >= 0")
    return ReasoningGymTask(
        name=f"{REASONING_GYM_PREFIX}{name}", dataset=name, config=config, format_weight=float(format_weight),
        system_prompt=default_system_prompt() if system_prompt is None else system_prompt,
    )


# --------------------------------------------------------------------------------------------
# Reward functions (TRL signature)
# --------------------------------------------------------------------------------------------


def completion_text(completion: Any) -> str:
    """A completion as text: a string as is, TRL's conversational ``[{"role", "content"}]``
    as its last message's content."""
    if isinstance(completion, str):
        return completion
    return str(completion[-1]["content"]) if completion else ""


def extract_answer(completion: Any) -> str | None:
    """The stripped content of the last ``<answer>...</answer>`` block, None without one."""
    from reasoning_gym.utils import extract_answer as rg_extract

    return rg_extract(completion_text(completion))


@functools.lru_cache(maxsize=64)
def _scorer(name: str, config_json: str):
    """The ``score_answer`` of dataset ``name`` configured as ``config_json`` (cached: building
    a dataset object per reward call would dominate the reward time)."""
    return create_procedural_dataset(name, json.loads(config_json), size=1, seed=0).score_answer


def reasoning_gym_reward(completions: list, metadata: list[dict], answer: list, question: list | None = None,
                         rg_config: list | None = None, **kwargs) -> list[float]:
    """reward_i = score_answer(extract_answer(completion_i), entry_i), in [0, 1].

    entry_i = {question, answer, metadata} rebuilt from the row's columns; the verifier is the
    one of ``metadata["source_dataset"]`` configured by ``rg_config`` (default config if absent).
    """
    questions = question or [None] * len(completions)
    configs = rg_config or [None] * len(completions)
    rewards = []
    for completion, meta, gold, q, config in zip(completions, metadata, answer, questions, configs, strict=True):
        score = _scorer(meta["source_dataset"], json.dumps(config or {}, sort_keys=True))
        entry = {"question": q, "answer": gold, "metadata": meta}
        rewards.append(float(score(extract_answer(completion), entry)))
    return rewards


def is_answer_formatted(text: str) -> bool:
    """The stripped text ends with its only ``<answer>...</answer>`` block, whose body is not
    blank (free reasoning text may precede the block)."""
    text = text.strip()
    if text.count(OPEN_TAG) != 1 or text.count(CLOSE_TAG) != 1 or not text.endswith(CLOSE_TAG):
        return False
    return bool(text[text.index(OPEN_TAG) + len(OPEN_TAG) : -len(CLOSE_TAG)].strip())


def answer_format_reward(completions: list, **kwargs) -> list[float]:
    """1.0 where :func:`is_answer_formatted`, else 0.0 (the format reward of TRL's examples,
    without the ``<think>`` block that small models rarely emit)."""
    return [float(is_answer_formatted(completion_text(c))) for c in completions]


def math_verify_reward(completions: list, answer: list, **kwargs) -> list[float | None]:
    """1.0 when math-verify finds the extracted answer equal to the gold ``answer`` (parsed as
    LaTeX or a plain expression), 0.0 otherwise or without an answer block; None when the gold
    itself does not parse (the sample is skipped, as TRL's ``accuracy_reward`` does).

    math-verify's timeouts use SIGALRM, which only the main thread may set: elsewhere they are off.
    """
    from math_verify import parse, verify

    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    rewards: list[float | None] = []
    for completion, gold in zip(completions, answer, strict=True):
        gold_parsed = parse(str(gold), parsing_timeout=timeout)
        if not gold_parsed:
            rewards.append(None)
            continue
        extracted = extract_answer(completion)
        if extracted is None:
            rewards.append(0.0)
            continue
        predicted = parse(extracted, parsing_timeout=timeout)
        rewards.append(float(verify(gold_parsed, predicted, timeout_seconds=timeout)))
    return rewards


#: A number as written in a reply: optional sign, digits with optional thousands commas, optional
#: decimals ("-1,234.5"); a comma or full stop that only ends a sentence is not part of it.
_NUMBER = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?|[-+]?\d+(?:\.\d+)?")


def final_number(text: str) -> Decimal | None:
    """The last number written in ``text`` (``_NUMBER``; commas of thousands dropped), None without one;
    a Decimal, exact at any length (a float would call 2^53 + 1 equal to 2^53).
    "7 + 7 = 14." -> 14; "1,234 apples" -> 1234; "x" -> None."""
    found = _NUMBER.findall(text)
    return Decimal(found[-1].replace(",", "")) if found else None


def final_number_reward(completions: list, answer: list, **kwargs) -> list[float | None]:
    """1.0 when the last number of the completion equals the gold ``answer`` (as numbers:
    ``14`` = ``14.0``), 0.0 otherwise or without a number; None when the gold is not a number
    (skipped). No answer tags needed: the "flexible extract" of lm-evaluation-harness's GSM8K
    (the last number in the reply), for instruct models too small to keep a format they were
    never trained on (SmolLM2-135M closes no ``<answer>`` tag: "Canned experiments", README)."""
    rewards: list[float | None] = []
    for completion, gold in zip(completions, answer, strict=True):
        gold_text = str(gold).strip()
        if _NUMBER.fullmatch(gold_text) is None:  # "ten", "1/2": no number to compare with
            rewards.append(None)
            continue
        predicted = final_number(completion_text(completion))
        rewards.append(float(predicted is not None and predicted == final_number(gold_text)))
    return rewards


#: Reward functions by registry name; ``rewards.py`` registers them (``register_reward``).
REASONING_REWARDS = {
    "reasoning_gym": reasoning_gym_reward,
    "answer_format": answer_format_reward,
    "math_verify": math_verify_reward,
    "final_number": final_number_reward,
}
for _name, _fn in REASONING_REWARDS.items():
    _fn.reward_name = _name  # metrics read rewards/<name> even before registration
