"""Built-in tasks with verifiable rewards, and loading of custom prompt datasets.

A task is a prompt generator plus the reward functions that score completions of its prompts.
Every row a task generates has a ``prompt`` key, the columns its reward functions read
(``answer``, ``target``, ``letter``) and a ``reference`` column: one correct completion, used
for the built-in tiny model's supervised warm-up (``tiny.py``) and shown as the expected answer.

Custom datasets (JSONL, CSV, or a ``datasets`` directory saved with ``save_to_disk``) need a
``prompt`` column; every other column is passed to the reward functions as a keyword argument.
"""

from __future__ import annotations

import csv
import json
import random
import string
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.engine.reasoning import EVAL_SEED_OFFSET, ReasoningGymTask, is_reasoning_gym_task, reasoning_gym_task
from workbench.engine.rewards import RewardFn, load_reward_function, reward_weights_for
from workbench.yamlsafe import short

Row = dict[str, Any]
#: Held-out prompts of a built-in task are the first distinct ones among this many x n rows.
HELD_OUT_SCAN = 20


def prompt_key(prompt: Any) -> str:
    """A hashable identity of a prompt of either TRL format (text, or a list of messages)."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def distinct_prompt_rows(rows: list[Row], n: int) -> list[Row]:
    """The first ``n`` rows whose prompts differ (fewer when the rows hold fewer)."""
    seen: set[str] = set()
    out = []
    for row in rows:
        key = prompt_key(row["prompt"])
        if key not in seen and len(out) < n:
            seen.add(key)
            out.append(row)
    return out


@dataclass(frozen=True)
class Task:
    """A built-in task: prompts + verifiable rewards.

    Attributes:
        name: registry key (``arithmetic``).
        description: one line for the UI.
        reward_funcs: built-in reward names or ``package.module:function`` references.
        reward_weights: one weight per reward function.
        make_dataset: ``(n, seed) -> n rows``, deterministic in ``seed``.
    """

    name: str
    description: str
    reward_funcs: tuple[str, ...]
    reward_weights: tuple[float, ...]
    make_dataset: Callable[[int, int], list[Row]]

    @property
    def correct_reward(self) -> str:
        """The verifier among the reward functions (the first, by convention of every built-in
        task): a completion is correct when it returns 1.0, its maximum (held-out pass@k)."""
        return self.reward_funcs[0]

    def splits(self, n_train: int, n_eval: int, seed: int) -> tuple[list[Row], list[Row]]:
        """(train rows, eval rows) with no prompt in both: eval = the first ``n_eval`` distinct
        prompts of the stream ``seed + EVAL_SEED_OFFSET``, train = ``n_train`` rows of ``seed``
        without them. A task with too few distinct prompts for that raises ValueError."""
        eval_rows = distinct_prompt_rows(self.make_dataset(max(n_eval, 1) * HELD_OUT_SCAN, seed + EVAL_SEED_OFFSET), n_eval)
        if len(eval_rows) < n_eval:
            raise ValueError(
                f"eval.num_prompts={n_eval}: task {self.name!r} yields only {len(eval_rows)} distinct prompts; "
                "ask for fewer held-out prompts")
        held_out = {prompt_key(row["prompt"]) for row in eval_rows}
        train = [row for row in self.make_dataset(n_train, seed) if prompt_key(row["prompt"]) not in held_out]
        if not train:
            raise ValueError(
                f"eval.num_prompts={n_eval}: task {self.name!r} has no prompt left to train on once the "
                "held-out prompts are removed; ask for fewer held-out prompts or use eval.every=0")
        return train, eval_rows

    def __post_init__(self) -> None:
        try:
            reward_weights_for(self.reward_weights, self.reward_funcs)
        except ValueError as err:
            raise ValueError(f"task {self.name!r}: {err}") from None

    def reward_functions(self) -> list[RewardFn]:
        """The task's reward functions, resolved (same order as ``reward_weights``)."""
        return [load_reward_function(ref) for ref in self.reward_funcs]


# --------------------------------------------------------------------------------------------
# Generators (pure: a seeded random.Random, no global state)
# --------------------------------------------------------------------------------------------

ARITHMETIC_MAX_OPERAND = 10
ARITHMETIC_OPS: dict[str, Callable[[int, int], int]] = {"+": lambda a, b: a + b, "-": lambda a, b: a - b}

REVERSE_ALPHABET = "abcde"
REVERSE_LENGTHS = (3, 6)  # inclusive

PROBE_MAX_TAIL = 8  # reference completions: the letter + 0..8 free letters


def arithmetic_rows(n: int, seed: int) -> list[Row]:
    """Arithmetic: ``"7+5="`` -> ``"12"`` then EOS (operands 0-10, ``+`` and ``-``).

    Teaches exact, verifiable answers: ``exact_match`` pays only the right number with nothing
    after it (so the model must also learn to stop), and a small ``format`` reward pays any
    integer, giving a partial signal while most answers are still wrong. Answers range over
    -10..20 (242 distinct problems). Operands stop at 10 because a ~20 s CPU warm-up of the
    tiny model reaches only ~5% accuracy on 0-20 but ~20-25% on 0-10: partly right, so the
    reward starts non-zero and RL has room to improve within a short CPU run.
    """
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, ARITHMETIC_MAX_OPERAND), rng.randint(0, ARITHMETIC_MAX_OPERAND)
        op = rng.choice(sorted(ARITHMETIC_OPS))
        answer = str(ARITHMETIC_OPS[op](a, b))
        rows.append({"prompt": f"{a}{op}{b}=", "answer": answer, "reference": answer})
    return rows


ARITHMETIC_DRILL_SIZE = 16


def arithmetic_drill_rows(n: int, seed: int) -> list[Row]:
    """A fixed drill of ``ARITHMETIC_DRILL_SIZE`` arithmetic problems, repeated to ``n`` rows.

    The same few problems come back every few steps, so the tiny model's reward climbs within a
    minute or two of CPU time: the quick comparison uses it to show algorithms differing fast.
    It measures learning speed on a small set, not generalisation (use ``arithmetic`` for that).
    """
    pool = arithmetic_rows(ARITHMETIC_DRILL_SIZE, seed)
    return [pool[i % len(pool)] for i in range(n)]


#: The presets' default task: four one-digit problems the warmed-up tiny model answers right
#: about a third of the time. Fixed (not drawn with the run's seed): drawn sets vary in
#: difficulty, and on some of them a preset's reward stayed flat for 80 steps.
ARITHMETIC_FOUR = (("3+2=", "5"), ("7-4=", "3"), ("6+1=", "7"), ("9-5=", "4"))


def arithmetic_four_rows(n: int, seed: int) -> list[Row]:
    """The four problems of ``ARITHMETIC_FOUR`` repeated to ``n`` rows, starting at problem
    ``seed % 4`` (the set never depends on the seed; the trainer shuffles rows with the run's seed).

    Within 60 steps on the tiny model (seconds on a CPU) the reward of every preset but CISPO
    rose on every seed measured (+0.19 to +0.80; CISPO: +0.46, -0.11, +0.01 on seeds 3-5); it
    measures memorising four answers, nothing more.
    """
    pool = [{"prompt": p, "answer": a, "reference": a} for p, a in ARITHMETIC_FOUR]
    return [pool[(i + seed) % len(pool)] for i in range(n)]


def reverse_rows(n: int, seed: int) -> list[Row]:
    """Reverse: ``"rev:abcd="`` -> ``"dcba"`` (3-6 letters from ``abcde``).

    Teaches with a dense, graded reward: ``position_match`` pays the fraction of positions
    right, so every extra correct character is rewarded. A model that only emits letters of
    the right length already scores about 1/5 per position (5-letter alphabet), leaving a long,
    smooth climb to 1.0 instead of the all-or-nothing signal of ``arithmetic``.
    """
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        word = "".join(rng.choice(REVERSE_ALPHABET) for _ in range(rng.randint(*REVERSE_LENGTHS)))
        rows.append({"prompt": f"rev:{word}=", "target": word[::-1], "reference": word[::-1]})
    return rows


def length_probe_rows(n: int, seed: int) -> list[Row]:
    """Length probe: ``"word:k="`` -> any completion whose first character is ``k``.

    Teaches nothing useful on purpose: it isolates the effect of loss aggregation on length.
    ``first_char`` pays 1.0 for the right first letter regardless of what follows, so no
    length is preferred by the reward and any drift in ``completions/mean_length`` comes from
    the optimiser. With ``seq-mean-token-mean`` (GRPO) each sequence's loss is divided by its
    own length: a long wrong completion gets a smaller per-token penalty than a short one, and a
    short right one a bigger per-token push, so lengths drift (long when most samples are
    wrong). ``token-mean`` (DAPO) weighs every token equally and ``seq-mean-token-sum-norm``
    (Dr. GRPO, constant normaliser) removes the per-sequence 1/|o| factor. Measured
    (``bench/learning_bench.py --part length``, tiny model, 120 steps, L_max 24): mean length
    drifts from ~16 to ~24 under seq-mean-token-mean (+8.2) and seq-mean-token-sum-norm (+8.5),
    and least under token-mean (+4.8): on this model the sampler's own drift towards long
    completions dominates, and aggregation changes its speed rather than its sign.
    The reference completions used for warm-up have random lengths (1-9 letters) so the model
    starts with a spread of lengths for the aggregation to act on.
    """
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        letter = rng.choice(string.ascii_lowercase)
        tail = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(0, PROBE_MAX_TAIL)))
        rows.append({"prompt": f"word:{letter}=", "letter": letter, "reference": letter + tail})
    return rows


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Add ``task`` to the registry (names are unique)."""
    if task.name in TASKS:
        raise ValueError(f"task {task.name!r} is already registered")
    TASKS[task.name] = task
    return task


register_task(
    Task(
        name="arithmetic",
        description="Add or subtract two numbers 0-10 ('7+5=' -> '12'); exact match + a small format reward.",
        reward_funcs=("exact_match", "format"),
        reward_weights=(1.0, 0.2),
        make_dataset=arithmetic_rows,
    )
)
register_task(
    Task(
        name="arithmetic_drill",
        description=f"{ARITHMETIC_DRILL_SIZE} fixed arithmetic problems, repeated: reward climbs within a minute or two on a CPU.",
        reward_funcs=("exact_match", "format"),
        reward_weights=(1.0, 0.2),
        make_dataset=arithmetic_drill_rows,
    )
)
register_task(
    Task(
        name="arithmetic_four",
        description="4 fixed one-digit problems, repeated: the reward rises within 60 steps (seconds on a "
        "CPU); the presets' default.",
        reward_funcs=("exact_match", "format"),
        reward_weights=(1.0, 0.2),
        make_dataset=arithmetic_four_rows,
    )
)
register_task(
    Task(
        name="reverse",
        description="Reverse 3-6 letters ('rev:abcd=' -> 'dcba'); dense reward = fraction of positions right.",
        reward_funcs=("position_match",),
        reward_weights=(1.0,),
        make_dataset=reverse_rows,
    )
)
register_task(
    Task(
        name="length_probe",
        description="Start with the given letter ('word:k=' -> 'k...'); reward ignores length, "
        "so loss aggregation alone moves completion length.",
        reward_funcs=("first_char",),
        reward_weights=(1.0,),
        make_dataset=length_probe_rows,
    )
)


def get_task(name: str) -> Task:
    """The registered task ``name``; ValueError listing the registered names otherwise."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(
            f"unknown task {name!r}; registered tasks: {', '.join(sorted(TASKS))}, or reasoning_gym/<dataset>"
        ) from None


BUILTIN_FAMILY = "built-in"


def task_catalogue() -> dict[str, list[str]]:
    """Every task value a recipe's ``task`` takes, grouped for a picker: {'built-in': the
    registered tasks, 'reasoning-gym · <family>': its datasets as ``reasoning_gym/<name>``, ...}.
    The family is the reasoning-gym subpackage a dataset lives in (arithmetic, algebra, games,
    logic, ...), read from its registry, so a new dataset lands in its family by itself. Groups
    in order: built-in first, then families by name; names sorted within each."""
    from reasoning_gym.factory import DATASETS

    from workbench.engine.reasoning import REASONING_GYM_PREFIX

    groups: dict[str, list[str]] = {BUILTIN_FAMILY: sorted(TASKS)}
    families: dict[str, list[str]] = {}
    for name, (dataset_cls, _config) in DATASETS.items():
        family = dataset_cls.__module__.split(".")[1] if dataset_cls.__module__.count(".") else "other"
        families.setdefault(f"reasoning-gym · {family}", []).append(REASONING_GYM_PREFIX + name)
    return groups | {family: sorted(families[family]) for family in sorted(families)}


def resolve_task(name: str, config: dict[str, Any] | None = None, *, system_prompt: str | None = None) -> Task | ReasoningGymTask:
    """A built-in task, or the reasoning-gym task ``reasoning_gym/<dataset>`` configured by
    ``config`` (its prompts' system message ``system_prompt``, default reasoning-gym's).
    Both kinds offer reward_funcs, reward_weights, correct_reward and splits(n_train, n_eval, seed)."""
    if is_reasoning_gym_task(name):
        return reasoning_gym_task(name, config, system_prompt=system_prompt)
    return get_task(name)


# --------------------------------------------------------------------------------------------
# Custom datasets
# --------------------------------------------------------------------------------------------


#: Limits of a custom dataset, checked before a run directory exists (engine/precheck.py) and again
#: when the trainer reads it. A prompt is bounded in characters, not tokens: prompts longer than
#: sampling.max_prompt_length tokens are left-truncated as in TRL (and counted), and this bound
#: keeps their tokenisation small (a 50 MB prompt line took ~20 GB before step 0).
MAX_DATASET_BYTES = 256 << 20
MAX_PROMPT_CHARS = 1 << 16


class DatasetError(ValueError):
    """A custom dataset that cannot be trained on; one line naming the field (dataset=...)."""


def _decode_lines(path: Path, field: str):
    """(line number, text) of a UTF-8 file, without the byte-order mark Excel writes at its start
    (utf-8-sig: a BOM left in made the first column '\\ufeffprompt'); DatasetError at the first
    byte that is not UTF-8."""
    with path.open("rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                yield line_no, raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise DatasetError(f"{field}={short(str(path), 240)}: line {line_no} is not UTF-8 text (byte {err.start}); "
                                   "save the file as UTF-8") from None


_TOO_MANY_DIGITS = (f"an integer of more than {sys.get_int_max_str_digits()} digits; write long numbers as text "
                    "(in quotes)")


def _read_jsonl(path: Path, field: str = "dataset") -> list[Row]:
    """One JSON object per non-blank line."""
    rows = []
    for line_no, line in _decode_lines(path, field):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{field}={short(str(path), 240)}: line {line_no} is not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise DatasetError(f"{field}={short(str(path), 240)}: line {line_no} nests too deeply") from None
        except ValueError:  # Python's int-string limit (a 5000-digit integer)
            raise DatasetError(f"{field}={short(str(path), 240)}: line {line_no}: {_TOO_MANY_DIGITS}") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{field}={short(str(path), 240)}: line {line_no} is not a JSON object")
        rows.append(row)
    return rows


def _read_json(path: Path, field: str = "dataset") -> list[Row]:
    """A JSON array of objects."""
    text = "".join(line for _, line in _decode_lines(path, field))
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise DatasetError(f"{field}={short(str(path), 240)}: not valid JSON ({getattr(exc, 'msg', 'nested too deeply')})") from None
    except ValueError:  # Python's int-string limit
        raise DatasetError(f"{field}={short(str(path), 240)}: {_TOO_MANY_DIGITS}") from None
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        raise DatasetError(f"{field}={short(str(path), 240)}: expected a JSON array of objects")
    return data


def _read_csv(path: Path, field: str = "dataset") -> list[Row]:
    """CSV with a header row; values stay strings (reward functions compare ``str(...)``). A field
    over csv's field_size_limit (131072 characters) is refused, naming its line."""
    reader = csv.DictReader(line for _, line in _decode_lines(path, field))
    rows = []
    try:
        for row in reader:
            if None in row:  # DictReader's key for the fields past the header's
                raise DatasetError(f"{field}={short(str(path), 240)}: line {reader.line_num} has more fields than the "
                                   f"header's {len(reader.fieldnames or [])} columns; quote values that hold commas")
            rows.append(row)
    except csv.Error as err:
        raise DatasetError(f"{field}={short(str(path), 240)}: line {reader.line_num}: {short(str(err)).strip(chr(39))}") from None
    return rows


_FILE_READERS: dict[str, Callable[..., list[Row]]] = {
    ".jsonl": _read_jsonl,
    ".json": _read_json,
    ".csv": _read_csv,
}


def _prompt_problem(prompt: Any) -> str | None:
    """Why ``prompt`` cannot be trained on (None when it can): empty, too long, or neither text
    nor a list of {role, content} messages."""
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "role" in m for m in prompt):
        text = "".join(str(m.get("content", "")) for m in prompt)
    else:  # its type, not its value: an error never quotes a file's contents
        return f"prompt is a {type(prompt).__name__}, neither text nor a list of {{role, content}} messages"
    if not text.strip():
        return "prompt is empty"
    if len(text) > MAX_PROMPT_CHARS:
        return f"prompt has {len(text)} characters: at most {MAX_PROMPT_CHARS}"
    return None


def _read_saved_dataset(path: Path, split: str) -> list[Row]:
    """A directory written by ``datasets``' ``save_to_disk`` (Dataset or DatasetDict)."""
    try:
        import datasets  # optional dependency
    except ImportError as exc:
        raise ValueError(
            f"dataset {str(path)!r} is a directory, which needs the 'datasets' package "
            "(pip install datasets); or use a .jsonl / .csv file"
        ) from exc
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise ValueError(f"dataset {str(path)!r} has no split {split!r}; splits: {sorted(loaded)}")
        loaded = loaded[split]
    return [dict(row) for row in loaded]


def load_dataset_rows(source: str, *, split: str = "train", limit: int | None = None, field: str = "dataset") -> list[Row]:
    """Rows of a custom prompt dataset: ``.jsonl``, ``.json``, ``.csv`` or a saved ``datasets`` dir.

    Every row must have a ``prompt``; other columns pass through to the reward functions.
    ``split`` selects the split of a saved DatasetDict; ``limit`` keeps the first rows.
    Raises DatasetError (a ValueError) naming ``field`` (dataset / eval.dataset) and the file when
    it is missing, of an unknown kind, over MAX_DATASET_BYTES, not UTF-8, malformed, empty, or a
    row lacks a usable ``prompt`` (empty, over MAX_PROMPT_CHARS, of another type).
    """
    path = Path(source).expanduser()
    where = f"{field}={short(source, 240)}"
    if not path.exists():
        raise DatasetError(f"{where} does not exist")
    if path.is_dir():
        rows = _read_saved_dataset(path, split)
    else:
        reader = _FILE_READERS.get(path.suffix.lower())
        if reader is None:
            raise DatasetError(
                f"{where}: unsupported file type {short(path.suffix)}; "
                f"use one of {', '.join(sorted(_FILE_READERS))} or a saved datasets directory"
            )
        size = path.stat().st_size
        if size > MAX_DATASET_BYTES:
            raise DatasetError(f"{where}: {size} bytes: at most {MAX_DATASET_BYTES}")
        rows = reader(path, field)
    if limit is not None:
        rows = rows[: max(0, int(limit))]
    if not rows:
        raise DatasetError(f"{where} has no rows")
    for index, row in enumerate(rows):
        if "prompt" not in row:
            raise DatasetError(f"{where}: row {index} has no 'prompt' column (it has {len(row)} other columns); "
                               "a 'prompt' column is required")  # not their names: never a file's contents
        problem = _prompt_problem(row["prompt"])
        if problem:
            raise DatasetError(f"{where}: row {index}: {problem}")
    return rows
