"""Runs made outside the workbench, imported into the run store beside the workbench's own runs
(Live, Compare, the arms view and the verdict table read them like any other run).

Formats (``FORMATS``, a registry keyed by name; ``--format`` picks one, else the first whose
``sniff`` accepts the path):

- ``trl-state``: TRL's ``trainer_state.json`` (``Trainer.save_state()``, or a checkpoint's), its
  ``log_history``: one entry per logged step, TRL's metric names, no timestamps;
- ``tensorboard``: TRL's TensorBoard event files (``report_to=["tensorboard"]``: ``train/<name>``
  and ``eval/<name>`` scalars, the training arguments as the ``args`` text summary), read with
  TensorBoard's own ``EventAccumulator`` (every event kept: ``size_guidance`` 0). TensorBoard stores
  scalars as float32, so these values are TRL's rounded to float32 (``trl-state`` has them in full);
- ``verl-jsonl``: verl's file logger (``trainer.logger=['file']``; ``verl/utils/tracking.py``
  ``FileLogger``): one ``{"step": N, "data": {...}}`` object per line;
- ``verl-console``: verl's console logger (``verl/utils/logger/aggregate_logger.py``
  ``concat_dict_to_str``): lines ``step:N - name:value - name:value``, a value as ``pprint``
  writes it (``0.25``, ``np.float64(0.25)`` under numpy 2); other lines (Ray's, the config dump)
  are skipped, a Ray prefix such as ``(TaskRunner pid=1)`` is allowed.

Names (``TRL_NAMES``, ``VERL_NAMES``): each framework's names are mapped to the workbench's, which
are TRL's where TRL logs the same quantity; a name with no counterpart is kept as the framework
wrote it. Read from trl 1.16.0's ``GRPOTrainer`` (installed here) and from verl's sources at
volcengine/verl b178a3c (0.8.0.dev, January 2026: ``verl/trainer/ppo/metric_utils.py``,
``verl/workers/actor/dp_actor.py``, ``verl/trainer/ppo/core_algos.py``, ``verl/utils/tracking.py``;
the newest verl the sources available here held, 0.9.x's were not among them).

=================================  ===========================  ===============================================
workbench                          TRL 1.16 GRPOTrainer         verl (metric_utils, dp_actor, core_algos)
=================================  ===========================  ===============================================
reward                             reward                       critic/score/mean (sequence score, before any
                                                                in-reward KL penalty)
reward_std, frac_reward_zero_std   same                         (not logged)
kl                                 kl (k3 to the reference)     actor/kl_loss (in-loss KL to the reference);
                                                                actor/ppo_kl is KL(old || new), not this: kept
entropy                            entropy                      actor/entropy
clip_ratio/region_mean             clip_ratio/region_mean       actor/pg_clipfrac (clipped term active: ratio
                                                                > 1+eps with A > 0 or < 1-eps with A < 0)
clip_ratio/dual_mean               (no dual clip)               actor/pg_clipfrac_lower (dual clip, A < 0)
clip_ratio/low_mean, ...           same                         (not logged)
completions/mean_length, _min_,    same                         response_length/mean, /min, /max
_max_
completions/clipped_ratio          same                         response_length/clip_ratio
loss/policy (policy term alone:    loss, when beta = 0 and no   actor/pg_loss
no KL, no entropy bonus)           entropy bonus; policy_loss
                                   when beta = 0
loss/value                         (no critic)                  critic/vf_loss
value/clipfrac                     (no critic)                  critic/vf_clipfrac
grad_norm                          grad_norm                    actor/grad_norm
lr                                 learning_rate                actor/lr
perf/step_time                     step_time                    perf/time_per_step
cispo/clip_ratio                   cispo_clip_ratio             (kept)
=================================  ===========================  ===============================================

verl averages its per-token figures (entropy, clip fractions, KL) with the run's ``loss_agg_mode``
and over micro-batches: under ``token-mean`` they are TRL's token means, under a ``seq-mean-*`` mode
sequence means.

TRL's ``loss`` is the step's whole objective (policy term + beta x KL - entropy bonus) and its
``policy_loss`` (logged only with an entropy bonus) includes beta x KL, while the workbench's
``loss/policy`` is the policy term alone: they are mapped only when the training arguments say
they are equal, else kept under TRL's names with a warning on the run. TRL's held-out metrics
(``eval_reward``: sampled at the training temperature) keep TRL's ``eval_`` names: the
workbench's ``eval/*`` are greedy, and ``eval/reward`` is the verdict's default metric.

Steps: row ``s`` of a workbench run holds what the policy after ``s`` updates did (its rollout's
training metrics; its held-out evaluation). TRL and verl count optimiser steps from 1 and log a
step's training metrics after its update, their evaluations after the update too: training
metrics of step ``k`` are stored at ``k - 1``, held-out ones (``eval_*``, verl ``val-*``) at ``k``,
but the final evaluation (after the last update) on the last row, as the workbench logs its own.
A step logged twice (a resumed run) keeps its last values.

Recipe: only what the log or the training arguments say (``TRL_ARGS``, ``VERL_CONFIG``: the
arguments come from ``--config`` (TRL's ``args.to_json_string()``, verl's Hydra
``.hydra/config.yaml``), else from TensorBoard's ``args`` text, also for a ``trainer_state.json``
whose output_dir holds one TensorBoard run (``trl_args_beside``)) is written into the run's
recipe, under the workbench's field names; nothing is filled in from defaults, and what is
missing is said in a warning on the run. The recipe is therefore a partial one (a YAML comment
says so). Its ``train.seed`` is the
seed the run trained with (TRL's ``seed``) or the one given with ``--seed``; both given and
different is refused, as is neither: the store keys replicates by seed.

Non-finite numbers (NaN, +-Infinity) refuse the whole import, naming the step and the metric:
nothing is stored. ``null`` (TRL's value for a step where no reward function returned a value)
means "not logged".

An imported run is ``finished``, its target and launcher ``import``, its owner the principal
(authorised as ``launch``: importing registers runs as launching does), its events stored once:
its id is derived from the imported rows (``<framework>-import-<hash>``), so importing the same
log again is refused, naming the run it already is (delete that run to import it again). It has no
run directory: nothing of the source is copied, deleting the run leaves the source as it was.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from workbench.runs import audit
from workbench.runs.authz import Principal, authorize
from workbench.runs.ingest import INT64_MAX
from workbench.runs.records import NewRun, RunError, RunRepository

IMPORT_TARGET = "import"  # an imported run's target and launcher: no launcher can start, cancel or resume it
MAX_IMPORT_STEPS = 1_000_000  # the recipe's train.steps bound
MAX_METRICS_PER_STEP = 2_000


class LogError(RunError):
    """A log that cannot be imported (one line: the file, what is wrong, what is allowed)."""


# ---- what a parser reads --------------------------------------------------------------------------


@dataclass(frozen=True)
class Logged:
    """One logged entry of the source: its own step number, its values (source names) and, where the
    format records it, its wall-clock time."""

    step: int
    values: dict[str, float]
    time: float | None = None


@dataclass(frozen=True)
class SourceLog:
    """What a format's reader returns: the framework whose names the entries use, the entries in
    file order, the training arguments found in the source (None: none) and where they came from,
    and facts of the file (``max_steps``)."""

    framework: str
    entries: list[Logged]
    config: dict[str, Any] | None = None
    config_origin: str = ""
    max_steps: int | None = None

    @property
    def digest(self) -> str:
        """A hash of the logged entries (steps, source names, values), whatever arguments come with
        them: the same log gives the same run id, so it is imported once."""
        text = json.dumps([self.framework, [(e.step, sorted(e.values.items())) for e in self.entries]])
        return hashlib.sha256(text.encode()).hexdigest()


def _finite(value: Any, where: str, name: str) -> float | int | None:
    """A logged value as a number; None for what is not one (null, text); LogError for a
    non-finite number or an integer no store can hold."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        raise LogError(f"{where}: metric {name!r} = {value!r} is not a finite number; only finite numbers are "
                       "imported, nothing was stored")
    if isinstance(value, int) and abs(value) > INT64_MAX:
        raise LogError(f"{where}: metric {name!r} = {value} is out of range (|x| <= 2**63 - 1); nothing was stored")
    return value


def _step(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_IMPORT_STEPS:
        raise LogError(f"{where}: step={str(value)[:40]!r} is not allowed; an integer from 0 to {MAX_IMPORT_STEPS}")
    return value


def _numbers(data: Mapping[str, Any], where: str) -> dict[str, float]:
    """The numeric values of one entry (null and text left out), non-finite refused."""
    if len(data) > MAX_METRICS_PER_STEP:
        raise LogError(f"{where}: {len(data)} metrics in one step; at most {MAX_METRICS_PER_STEP}")
    out = {}
    for name, value in data.items():
        number = _finite(value, where, str(name))
        if number is not None:
            out[str(name)] = number
    return out


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise LogError(f"{path}: cannot be read ({getattr(err, 'strerror', None) or err})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise LogError(f"{path} is not JSON (line {err.lineno}: {err.msg})") from None


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a text file, read as it streams (a console log can be large)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            yield from enumerate(f, start=1)
    except OSError as err:
        raise LogError(f"{path}: cannot be read ({err.strerror or err})") from None


# ---- formats ---------------------------------------------------------------------------------------

TRL_RUN_SUMMARY = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos",
                             "train_loss"})  # Trainer's end-of-training entry: not a step


def read_trl_state(path: Path) -> SourceLog:
    """``trainer_state.json``: its ``log_history`` entries (the end-of-training summary left out)
    and ``max_steps``. The training arguments are not in it (``training_args.bin`` beside a
    checkpoint is a pickle: not read; give ``--config``)."""
    state = _read_json(path)
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise LogError(f"{path} has no log_history list: not a TRL trainer_state.json")
    entries = []
    for i, entry in enumerate(history):
        where = f"{path} log_history[{i}]"
        if not isinstance(entry, dict):
            raise LogError(f"{where} is not an object")
        if TRL_RUN_SUMMARY & entry.keys():
            continue
        values = _numbers({k: v for k, v in entry.items() if k != "step"}, f"{where} (step {entry.get('step')})")
        entries.append(Logged(_step(entry.get("step"), where), values))
    max_steps = state.get("max_steps")
    return SourceLog("trl", entries, max_steps=max_steps if isinstance(max_steps, int) and max_steps > 0 else None)


TB_EVENTS = "events.out.tfevents"


def _event_dir(path: Path) -> Path:
    """The one folder of TensorBoard event files ``path`` names: the file's folder is not used
    (a file is read alone); a folder holding event files, or holding exactly one folder that does."""
    found = sorted({p.parent for p in path.rglob(f"{TB_EVENTS}*") if p.is_file()})
    if not found:
        raise LogError(f"{path} holds no TensorBoard event files ({TB_EVENTS}*)")
    if len(found) > 1:
        names = ", ".join(str(p.relative_to(path)) or "." for p in found[:5])
        raise LogError(f"{path} holds {len(found)} TensorBoard runs ({names}{', ...' if len(found) > 5 else ''}); "
                       "give the folder of one")
    return found[0]


def _tb_text(accumulator, tag: str) -> str | None:
    """The first text summary of ``tag`` (``add_text`` writes a string tensor), or None."""
    from tensorboard.util import tensor_util

    if tag not in accumulator.Tags().get("tensors", []):
        return None
    events = accumulator.Tensors(tag)
    if not events:
        return None
    value = tensor_util.make_ndarray(events[0].tensor_proto).reshape(-1)[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def read_tensorboard(path: Path) -> SourceLog:
    """TRL's TensorBoard events: ``train/X`` -> X, ``eval/X`` -> ``eval_X`` (transformers'
    ``rewrite_logs`` undone, so both TRL formats give the same names), the end-of-training summary
    left out; each step's time is its latest scalar's ``wall_time``; the ``args`` text summary is
    the training arguments."""
    try:
        from tensorboard.backend.event_processing import event_accumulator as ea
    except ImportError:
        raise LogError("reading TensorBoard event files needs the tensorboard package "
                       "(pip install tensorboard); trainer_state.json needs nothing") from None
    source = path if path.is_file() else _event_dir(path)
    accumulator = ea.EventAccumulator(str(source), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    try:
        accumulator.Reload()
    except Exception as err:  # noqa: BLE001  (a damaged file: its reader's own error, one line)
        raise LogError(f"{path}: TensorBoard cannot read it ({type(err).__name__}: {err})") from None
    by_step: dict[int, dict[str, float]] = {}
    times: dict[int, float] = {}
    tags = accumulator.Tags().get("scalars", [])
    for tag in tags:
        prefix, _, name = tag.partition("/")
        if prefix not in ("train", "eval") or not name or (prefix == "train" and name in TRL_RUN_SUMMARY):
            continue
        name = name if prefix == "train" else f"eval_{name}"
        for event in accumulator.Scalars(tag):
            where = f"{path} (tag {tag!r}, step {event.step})"
            step = _step(event.step, where)
            value = _finite(float(event.value), where, name)
            by_step.setdefault(step, {})[name] = value
            times[step] = max(times.get(step, 0.0), float(event.wall_time))
    if not by_step and not any(t.startswith(("train/", "eval/")) for t in tags):
        raise LogError(f"{path}: no train/ or eval/ scalars: not TensorBoard events of a TRL (transformers) run")
    args_text = _tb_text(accumulator, "args/text_summary")
    config = None
    if args_text is not None:
        try:
            config = json.loads(args_text)
        except json.JSONDecodeError:
            config = None
    entries = [Logged(step, values, times[step]) for step, values in sorted(by_step.items())]
    return SourceLog("trl", entries, config if isinstance(config, dict) else None,
                     "the TensorBoard args text" if isinstance(config, dict) else "")


def read_verl_jsonl(path: Path) -> SourceLog:
    """verl's file logger: one ``{"step": N, "data": {name: value}}`` per line (blank lines skipped)."""
    entries = []
    for number, line in _lines(path):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise LogError(f"{where} is not JSON ({err.msg}); verl's file logger writes one "
                           '{"step": N, "data": {...}} object per line') from None
        if not isinstance(record, dict) or not isinstance(record.get("data"), dict):
            raise LogError(f'{where} is not a {{"step": N, "data": {{...}}}} object (verl file logger)')
        step = _step(record.get("step"), where)
        entries.append(Logged(step, _numbers(record["data"], f"{where} (step {step})")))
    return SourceLog("verl", entries)


VERL_CONSOLE_LINE = re.compile(r"(?:^|\s)step:(\d+)((?: - \S+:\S+)+)\s*$")
# pprint.pformat of a number: 0.25, -1e-05, 3, nan, inf; numpy 2 scalars as np.float64(0.25)
VERL_CONSOLE_VALUE = re.compile(r"^(?:np\.\w+\()?([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf))\)?$")


def read_verl_console(path: Path) -> SourceLog:
    """verl's console lines ``step:N - name:value - ...`` (``concat_dict_to_str``); every other
    line is skipped, and so is a value that is not a number as ``pprint`` writes one (``True``)."""
    entries = []
    for number, line in _lines(path):
        match = VERL_CONSOLE_LINE.search(line.rstrip("\n"))
        if match is None:
            continue
        where = f"{path} line {number}"
        values: dict[str, float] = {}
        for item in match.group(2).split(" - ")[1:]:
            name, _, text = item.rpartition(":")
            parsed = VERL_CONSOLE_VALUE.match(text)
            if parsed is None:  # not a number (True, a tensor's repr): not a metric, as null / text in JSON
                continue
            literal = parsed.group(1)
            value = int(literal) if re.fullmatch(r"[-+]?\d+", literal) else float(literal)
            values[name] = value
        entries.append(Logged(_step(int(match.group(1)), where), _numbers(values, f"{where} (step {match.group(1)})")))
    return SourceLog("verl", entries)


def _json_head(path: Path) -> Any:
    """The first non-blank line of a file parsed as JSON, or None."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.strip():
                    return json.loads(line)
    except (OSError, json.JSONDecodeError):
        return None
    return None


def _is_trl_state(path: Path) -> bool:
    if not path.is_file() or path.suffix != ".json":
        return False
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return path.name == "trainer_state.json"  # its reader names what is wrong with it
    return isinstance(data, dict) and "log_history" in data


def _is_tensorboard(path: Path) -> bool:
    if path.is_file():
        return path.name.startswith(TB_EVENTS)
    return path.is_dir() and next(path.rglob(f"{TB_EVENTS}*"), None) is not None


def _is_verl_jsonl(path: Path) -> bool:
    head = _json_head(path) if path.is_file() and path.suffix != ".json" else None
    return isinstance(head, dict) and "step" in head and isinstance(head.get("data"), dict)


def _is_verl_console(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            return any(VERL_CONSOLE_LINE.search(line.rstrip("\n")) for line in f)
    except OSError:
        return False


@dataclass(frozen=True)
class Format:
    """One importable format: its framework, how to recognise a path of it, how to read it."""

    framework: str
    sniff: Callable[[Path], bool]
    read: Callable[[Path], SourceLog]
    what: str


FORMATS: dict[str, Format] = {  # sniffed in this order
    "tensorboard": Format("trl", _is_tensorboard, read_tensorboard, "TRL TensorBoard event files (a file or its folder)"),
    "trl-state": Format("trl", _is_trl_state, read_trl_state, "TRL trainer_state.json"),
    "verl-jsonl": Format("verl", _is_verl_jsonl, read_verl_jsonl, "verl file logger JSONL"),
    "verl-console": Format("verl", _is_verl_console, read_verl_console, "verl console log"),
}


def detect_format(path: Path) -> str:
    """The first format of ``FORMATS`` whose sniff accepts ``path``; LogError naming them otherwise."""
    for name, fmt in FORMATS.items():
        if fmt.sniff(path):
            return name
    raise LogError(f"{path}: format not recognised; one of: "
                   + "; ".join(f"{name} ({fmt.what})" for name, fmt in FORMATS.items()))


# ---- the recipe: only what the arguments say ---------------------------------------------------------


def _lookup(config: Mapping[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _number(value: Any) -> float | int | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _choice(table: Mapping[Any, Any]) -> Callable[[Any], Any]:
    return lambda value: table.get(value) if isinstance(value, (str, bool)) else None


def _non_negative_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


# TRL GRPOConfig argument -> (workbench recipe field, conversion: None where the value says nothing)
TRL_ARGS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "num_generations": ("sampling.num_generations", _positive_int),
    "max_completion_length": ("sampling.max_completion_length", _positive_int),
    "temperature": ("sampling.temperature", _number),
    "top_p": ("sampling.top_p", _number),
    "learning_rate": ("optim.lr", _number),
    "max_grad_norm": ("optim.max_grad_norm", _number),
    "weight_decay": ("optim.weight_decay", _number),
    "warmup_steps": ("optim.warmup_steps", _non_negative_int),
    "lr_scheduler_type": ("optim.schedule", _choice({"constant": "constant", "linear": "linear", "cosine": "cosine"})),
    "beta": ("algorithm.kl_coef", _number),
    "epsilon": ("algorithm.eps_low", _number),
    "scale_rewards": ("algorithm.grpo_scale", _choice({"group": "group", "batch": "batch", "none": "none",
                                                        True: "group", False: "none"})),
    "delta": ("algorithm.delta", _number),
    "entropy_coef": ("algorithm.entropy_coef", _number),
    "top_entropy_quantile": ("algorithm.top_entropy_quantile", _number),
    "mask_truncated_completions": ("algorithm.mask_truncated", _flag),
    "num_iterations": ("train.mu", _positive_int),
    "max_steps": ("train.steps", _positive_int),
    "seed": ("train.seed", _non_negative_int),
}
# TRL loss_type -> (policy_loss, aggregation), from GRPOTrainer._compute_loss (trl 1.16)
TRL_LOSS_TYPES: dict[str, tuple[str, str]] = {
    "grpo": ("clip", "seq-mean-token-mean"), "bnpo": ("clip", "token-mean"), "dapo": ("clip", "token-mean"),
    "dr_grpo": ("clip", "seq-mean-token-sum-norm"), "luspo": ("gspo", "seq-mean-token-sum"),
    "cispo": ("cispo", "token-mean"), "sapo": ("sapo", "seq-mean-token-mean"), "vespo": ("vespo", "token-mean"),
}


def _set(recipe: dict[str, Any], dotted: str, value: Any) -> None:
    section, _, name = dotted.rpartition(".")
    recipe.setdefault(section, {})[name] = value


def trl_recipe(config: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The recipe fields GRPOConfig's arguments give (``TRL_ARGS``; loss_type and
    importance_sampling_level -> policy loss and aggregation; GRPOTrainer's advantage is GRPO's,
    its KL k3 in the loss) and the algorithm's label."""
    recipe: dict[str, Any] = {}
    for arg, (path, convert) in TRL_ARGS.items():
        value = convert(config.get(arg))
        if value is not None:
            _set(recipe, path, value)
    eps_high = _number(config.get("epsilon_high"))
    eps_high = eps_high if eps_high is not None else _number(config.get("epsilon"))  # TRL: None = epsilon
    if eps_high is not None:
        _set(recipe, "algorithm.eps_high", eps_high)
    _set(recipe, "algorithm.advantage", "grpo")
    loss_type = config.get("loss_type")
    if loss_type in TRL_LOSS_TYPES:
        policy_loss, aggregation = TRL_LOSS_TYPES[loss_type]
        if config.get("importance_sampling_level") == "sequence" and policy_loss == "clip":
            policy_loss = "gspo"
        _set(recipe, "algorithm.policy_loss", policy_loss)
        _set(recipe, "algorithm.aggregation", aggregation)
    if (_number(config.get("beta")) or 0) > 0:
        _set(recipe, "algorithm.kl_estimator", "k3")
        _set(recipe, "algorithm.kl_placement", "in_loss")
    return recipe, f"{loss_type} (TRL)" if isinstance(loss_type, str) else "GRPOTrainer (TRL)"


# verl Hydra config path -> (workbench recipe field, conversion)
VERL_CONFIG: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "actor_rollout_ref.rollout.n": ("sampling.num_generations", _positive_int),
    "data.train_batch_size": ("sampling.prompts_per_step", _positive_int),  # prompts per step, all ranks
    "data.max_response_length": ("sampling.max_completion_length", _positive_int),
    "actor_rollout_ref.rollout.temperature": ("sampling.temperature", _number),
    "actor_rollout_ref.rollout.top_p": ("sampling.top_p", _number),
    "actor_rollout_ref.actor.optim.lr": ("optim.lr", _number),
    "actor_rollout_ref.actor.clip_ratio_low": ("algorithm.eps_low", _number),
    "actor_rollout_ref.actor.clip_ratio_high": ("algorithm.eps_high", _number),
    "actor_rollout_ref.actor.clip_ratio_c": ("algorithm.clip_c", _number),
    "actor_rollout_ref.actor.entropy_coeff": ("algorithm.entropy_coef", _number),
    "actor_rollout_ref.actor.ppo_epochs": ("train.mu", _positive_int),
    "trainer.total_training_steps": ("train.steps", _positive_int),
    "algorithm.adv_estimator": ("algorithm.advantage", _choice({
        "grpo": "grpo", "rloo": "rloo", "reinforce_plus_plus": "reinforce_pp",
        "reinforce_plus_plus_baseline": "reinforce_pp_baseline", "gae": "gae", "remax": "remax", "opo": "opo",
        "grpo_passk": "grpo_passk", "gpg": "gpg", "optimal_token_baseline": "optimal_token_baseline",
        "tir_optimal_token_baseline": "tir_optimal_token_baseline"})),
    "algorithm.norm_adv_by_std_in_grpo": ("algorithm.grpo_scale", _choice({True: "group", False: "none"})),
    "actor_rollout_ref.actor.policy_loss.loss_mode": ("algorithm.policy_loss", _choice({
        "vanilla": "clip", "gspo": "gspo", "cispo": "cispo", "sapo": "sapo", "geo_mean": "gmpo", "dppo_tv": "dppo_tv",
        "dppo_kl": "dppo_kl", "clip_cov": "clip_cov", "kl_cov": "kl_cov", "gpg": "gpg"})),
    # seq-mean-token-sum-norm is left out: verl < 0.9 and >= 0.9 normalise it differently (the log
    # does not say which verl wrote it)
    "actor_rollout_ref.actor.loss_agg_mode": ("algorithm.aggregation", _choice({
        "token-mean": "token-mean", "seq-mean-token-mean": "seq-mean-token-mean",
        "seq-mean-token-sum": "seq-mean-token-sum"})),
}
VERL_KL_ESTIMATORS = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3", "abs": "abs"}


def verl_recipe(config: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The recipe fields verl's Hydra config gives (``VERL_CONFIG``; the KL from use_kl_loss /
    kl_loss_coef / kl_loss_type, or use_kl_in_reward / kl_ctrl.kl_coef / kl_penalty with the
    in-reward controller from ``verl_kl_controller``; the rollout correction, rejection and bypass
    mode from ``verl_rollout_mismatch``) and the label."""
    recipe: dict[str, Any] = {}
    for path, (target, convert) in VERL_CONFIG.items():
        value = convert(_lookup(config, path))
        if value is not None:
            _set(recipe, target, value)
    actor = "actor_rollout_ref.actor"
    if _lookup(config, f"{actor}.use_kl_loss") is True:
        coef, estimator, placement = (_lookup(config, f"{actor}.kl_loss_coef"), _lookup(config, f"{actor}.kl_loss_type"),
                                      "in_loss")
    elif _lookup(config, "algorithm.use_kl_in_reward") is True:
        coef, estimator, placement = (_lookup(config, "algorithm.kl_ctrl.kl_coef"), _lookup(config, "algorithm.kl_penalty"),
                                      "in_reward")
    elif _lookup(config, f"{actor}.use_kl_loss") is False and _lookup(config, "algorithm.use_kl_in_reward") is False:
        coef, estimator, placement = 0.0, None, None
    else:
        coef = estimator = placement = None
    if _number(coef) is not None:
        _set(recipe, "algorithm.kl_coef", coef)
    if estimator in VERL_KL_ESTIMATORS:
        _set(recipe, "algorithm.kl_estimator", VERL_KL_ESTIMATORS[estimator])
    if placement is not None:
        _set(recipe, "algorithm.kl_placement", placement)
    for path, value in (verl_kl_controller(config) if placement == "in_reward" else {}).items():
        _set(recipe, path, value)
    for path, value in verl_rollout_mismatch(config).items():
        _set(recipe, path, value)
    estimator_name = _lookup(config, "algorithm.adv_estimator")  # no seed: verl seeds data and rollout apart
    return recipe, f"{estimator_name} (verl)" if isinstance(estimator_name, str) else "verl"


#: verl algorithm.kl_ctrl.type -> algorithm.kl_controller (core.kl_control.KL_CONTROLLERS: verl's names)
VERL_KL_CONTROLLERS = {"fixed": "fixed", "adaptive": "adaptive"}


def verl_kl_controller(config: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe fields of verl's ``algorithm.kl_ctrl`` (KLControlConfig): type -> kl_controller,
    and for the adaptive one target_kl -> kl_target, horizon -> kl_horizon. verl builds the
    controller only for the KL in the reward (use_kl_in_reward); the caller asks only then. A
    value that is not a known type, a positive number or a positive integer is left out."""
    ctrl = "algorithm.kl_ctrl"
    kind = VERL_KL_CONTROLLERS.get(_lookup(config, f"{ctrl}.type")) if isinstance(_lookup(config, f"{ctrl}.type"), str) else None
    if kind is None:
        return {}
    out: dict[str, Any] = {"algorithm.kl_controller": kind}
    if kind == "adaptive":
        target, horizon = _number(_lookup(config, f"{ctrl}.target_kl")), _positive_int(_lookup(config, f"{ctrl}.horizon"))
        if target is not None and target > 0:
            out["algorithm.kl_target"] = target
        if horizon is not None:
            out["algorithm.kl_horizon"] = horizon
    return out


def _verl_rs_bounds(mode: str, spec: Any) -> tuple[float | None, float] | None:
    """(lower, upper) of one ``rollout_rs`` mode from verl's ``rollout_rs_threshold`` (a number,
    or a string "upper" / k1's "lower_upper"; verl ``_parse_rollout_rs_thresholds``); None where
    it does not parse, is not positive and finite, or has no recipe counterpart (a k1 upper < 1
    without a lower: verl's default lower 1 / upper then exceeds it and rejects every token)."""
    text = str(spec) if _number(spec) is not None else spec if isinstance(spec, str) else None
    if text is None or "," in text or (not mode.endswith("k1") and "_" in text):  # float() reads "1_0" as 10
        return None
    lower_text, _, upper_text = text.rpartition("_") if mode.endswith("k1") else ("", "", text)
    try:
        lower, upper = (float(lower_text) if lower_text else None), float(upper_text)
    except ValueError:
        return None
    if not all(v is None or (math.isfinite(v) and v > 0) for v in (lower, upper)):
        return None
    if mode.endswith("k1") and (lower if lower is not None else 1 / upper) > upper:
        return None
    return lower, upper


def verl_rollout_mismatch(config: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe fields of verl's ``algorithm.rollout_correction`` (RolloutCorrectionConfig):
    rollout_is token / sequence truncates the IS weight from above at rollout_is_threshold ->
    rollout_correction {level}_truncate with that max and rollout_is_batch_normalize;
    one rollout_rs mode with its rollout_rs_threshold -> rollout_rejection and its bounds. Several
    comma-separated modes (verl keeps a token only if each keeps it) have no single recipe value
    and are left out, as is anything that does not parse. bypass_mode=True replaces verl's policy
    loss with its bypass loss (``compute_policy_loss_bypass_mode``), which corrects and rejects
    inside the loss as the recipe's bypass_mode does: loss_type ppo_clip (verl's default) ->
    bypass_mode, policy_loss clip and the rejection (its IS weights are computed for metrics
    only, so rollout_is gives nothing); loss_type reinforce -> bypass_mode, policy_loss reinforce
    (reinforce_form logp: -w A log pi), the IS weights and the rejection."""
    from workbench.core.choices import IS_LEVELS, REJECTION_MODES

    rc = "algorithm.rollout_correction"
    bypass = _lookup(config, f"{rc}.bypass_mode") is True
    loss_type = _lookup(config, f"{rc}.loss_type")
    if bypass and loss_type not in (None, "ppo_clip", "reinforce"):
        return {}
    out: dict[str, Any] = {}
    level, threshold = _lookup(config, f"{rc}.rollout_is"), _number(_lookup(config, f"{rc}.rollout_is_threshold"))
    if level in IS_LEVELS and threshold is not None and threshold > 0:
        out["algorithm.rollout_correction"] = f"{level}_truncate"
        out["algorithm.rollout_correction_max"] = threshold
        if _lookup(config, f"{rc}.rollout_is_batch_normalize") is True:
            out["algorithm.rollout_correction_batch_normalize"] = True
    mode = _lookup(config, f"{rc}.rollout_rs")
    bounds = _verl_rs_bounds(mode, _lookup(config, f"{rc}.rollout_rs_threshold")) if mode in REJECTION_MODES else None
    if bounds is not None:
        out["algorithm.rollout_rejection"] = mode
        out["algorithm.rollout_rejection_max"] = bounds[1]
        if bounds[0] is not None:
            out["algorithm.rollout_rejection_min"] = bounds[0]
    if not bypass:
        return out
    if loss_type == "reinforce":
        return {"algorithm.bypass_mode": True, "algorithm.policy_loss": "reinforce", "algorithm.reinforce_form": "logp", **out}
    return {"algorithm.bypass_mode": True, "algorithm.policy_loss": "clip",
            **{k: v for k, v in out.items() if k.startswith("algorithm.rollout_rejection")}}


RECIPES: dict[str, Callable[[Mapping[str, Any]], tuple[dict[str, Any], str]]] = {"trl": trl_recipe, "verl": verl_recipe}
LABELS = {"trl": "GRPOTrainer (TRL)", "verl": "verl"}
# where each framework's training arguments are (what --config reads)
CONFIG_FILES = {"trl": "TRL's args.to_json_string(), as JSON (training_args.bin is a pickle: not read)",
                "verl": "the Hydra .hydra/config.yaml of the run"}
# what a recipe of an imported run never has: the logs of both frameworks do not say it
NEVER_RECOVERED = "model, task / dataset, reward functions"


# ---- names: each framework's -> the workbench's ----------------------------------------------------


TRL_NAMES = {"learning_rate": "lr", "step_time": "perf/step_time", "cispo_clip_ratio": "cispo/clip_ratio"}
VERL_NAMES = {
    "critic/score/mean": "reward", "actor/entropy": "entropy", "actor/pg_clipfrac": "clip_ratio/region_mean",
    "actor/pg_clipfrac_lower": "clip_ratio/dual_mean", "actor/kl_loss": "kl", "actor/pg_loss": "loss/policy",
    "actor/grad_norm": "grad_norm", "actor/lr": "lr", "critic/vf_loss": "loss/value", "critic/vf_clipfrac": "value/clipfrac",
    "response_length/mean": "completions/mean_length", "response_length/min": "completions/min_length",
    "response_length/max": "completions/max_length", "response_length/clip_ratio": "completions/clipped_ratio",
    "perf/time_per_step": "perf/step_time",
}


def trl_names(config: Mapping[str, Any] | None) -> tuple[dict[str, str], list[str]]:
    """TRL -> workbench names for this run, and why a loss was not mapped. ``loss`` (the whole
    objective) is the policy term alone when beta = 0 and there is no entropy bonus;
    ``policy_loss`` (logged with an entropy bonus) when beta = 0."""
    names = dict(TRL_NAMES)
    if config is None:
        return names, ["TRL's loss is kept as 'loss', not 'loss/policy': without the training arguments the "
                       "importer cannot tell whether it holds beta x KL or an entropy bonus"]
    beta = _number(config.get("beta"))
    bonus = (_number(config.get("entropy_coef")) or 0) != 0 or config.get("use_adaptive_entropy") is True
    if beta == 0:
        names["policy_loss"] = "loss/policy"
        if not bonus:
            names["loss"] = "loss/policy"
            return names, []
        return names, ["TRL's loss includes the entropy bonus: kept as 'loss' (policy_loss is 'loss/policy')"]
    return names, [f"TRL's loss and policy_loss include beta x KL (beta={beta}): kept under TRL's names, "
                   "not 'loss/policy' (the policy term alone)"]


def _is_eval(framework: str, name: str) -> bool:
    """A held-out metric: logged after the step's update (stored at the source's step)."""
    return name.startswith("eval_") if framework == "trl" else name.startswith("val-")


# ---- the imported run ----------------------------------------------------------------------------


@dataclass
class ImportedRun:
    """A source log in the workbench's terms: rows by stored step (workbench names), their times,
    the partial recipe, the label, the total steps, the seed the log says (None: it does not) and
    the warnings the run will carry."""

    framework: str
    format: str
    rows: dict[int, dict[str, float]]
    times: dict[int, float]
    recipe: dict[str, Any]
    algorithm: str
    total_steps: int
    seed: int | None
    config_origin: str
    warnings: list[str] = field(default_factory=list)

    digest: str = ""  # the source entries' hash (``SourceLog.digest``): the run id's suffix


def _cumulative(rows: dict[int, dict[str, float]], name: str, base: float) -> dict[int, float] | None:
    """Times from a per-step duration (TRL ``step_time``, verl ``timing_s/step``; a mean over the
    steps since the row before when logged every few steps): ``base`` + the steps' summed
    durations; a row without it (held-out metrics only) at the time of the row before. None when
    no row has it."""
    if not any(name in r for r in rows.values()):
        return None
    total, previous, out = 0.0, -1, {}
    for step in sorted(rows):
        if name in rows[step]:
            total += float(rows[step][name]) * (step - previous)
            previous = step
        out[step] = base + total
    return out


def convert(log: SourceLog, fmt: str, config: Mapping[str, Any] | None, config_origin: str,
            now: float | None = None, source: str = "the log") -> ImportedRun:
    """A ``SourceLog`` -> an ``ImportedRun`` (module docstring: names, steps, recipe). ``config``:
    the training arguments (None: none found); LogError naming ``source`` when it has no step."""
    now = time.time() if now is None else now
    warnings: list[str] = []
    if log.framework == "trl":
        names, loss_notes = trl_names(config)
        warnings += loss_notes
    else:
        names = dict(VERL_NAMES)
    rows: dict[int, dict[str, float]] = {}
    source_times: dict[int, float] = {}
    trained = [e.step - 1 for e in log.entries if e.step >= 1 and any(not _is_eval(log.framework, n) for n in e.values)]
    last_trained = max(trained, default=None)
    for entry in log.entries:
        for name, value in entry.values.items():
            held_out = _is_eval(log.framework, name)
            if not held_out and entry.step < 1:
                continue  # nothing trained yet at step 0: a training metric there is not from an update
            stored = (entry.step - 1 if not held_out
                      else entry.step if last_trained is None else min(entry.step, last_trained))
            rows.setdefault(stored, {})[names.get(name, name)] = value
            if entry.time is not None:
                source_times[stored] = max(source_times.get(stored, 0.0), entry.time)
    if not rows:
        raise LogError(f"{source} ({fmt}) has no logged step with a number: nothing to import")
    duration = {"trl": "perf/step_time", "verl": "timing_s/step"}[log.framework]
    times = source_times if len(source_times) == len(rows) else _cumulative(rows, duration, now)
    if times is None:
        times = dict.fromkeys(rows, now)
        warnings.append(f"the log has no times (nor {duration}): every step is stamped with the "
                        "import's time, so this run's wall-time axis is flat")
    recipe, algorithm = RECIPES[log.framework](config) if config is not None else ({}, LABELS[log.framework])
    last = max(rows)
    total_steps = log.max_steps or recipe.get("train", {}).get("steps") or last + 1
    total_steps = max(total_steps, last + 1)
    _set(recipe, "train.steps", total_steps)
    if last + 1 < total_steps:
        warnings.append(f"the log ends at step {last + 1} of {total_steps} (a checkpoint's state, or a run stopped early)")
    seed = recipe.get("train", {}).pop("seed", None)
    if config is None:
        where = CONFIG_FILES[log.framework]
        warnings.append(f"recipe: no training arguments found (give --config: {where}); only train.steps and train.seed "
                        "are known")
    else:
        warnings.append(f"recipe: recovered from {config_origin} (only the fields it gives); not in the log: "
                        f"{NEVER_RECOVERED}" + (", sampling.prompts_per_step (the world size is not logged)"
                                                 if log.framework == "trl" else ", the training seed"))
    return ImportedRun(log.framework, fmt, rows, times, recipe, algorithm, total_steps, seed, config_origin, warnings,
                       log.digest)


def read_config(path: Path, framework: str) -> dict[str, Any]:
    """Training arguments from a file: TRL's ``args.to_json_string()`` (JSON) or verl's Hydra
    ``config.yaml`` (YAML; JSON is YAML too). LogError naming the file when it is not a mapping."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise LogError(f"--config {path}: cannot be read ({getattr(err, 'strerror', None) or err})") from None
    try:
        data = json.loads(text) if framework == "trl" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        kind = "JSON (TRL: args.to_json_string())" if framework == "trl" else "YAML (verl: .hydra/config.yaml)"
        raise LogError(f"--config {path} is not {kind}: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise LogError(f"--config {path} is not a mapping of training arguments")
    return data


def read_log(path: str | Path, fmt: str | None = None, config: str | Path | None = None) -> ImportedRun:
    """Read and convert one log (pure of the store): ``fmt`` one of ``FORMATS`` (None: detected),
    ``config`` a file of training arguments (overrides any found in the log)."""
    path = Path(path)
    if fmt is not None and fmt not in FORMATS:
        raise LogError(f"format={fmt!r} is not allowed; one of: {', '.join(FORMATS)}")
    if not path.exists():
        raise LogError(f"{path} does not exist")
    fmt = fmt or detect_format(path)
    if path.is_dir() and fmt != "tensorboard":
        raise LogError(f"{path} is a folder; format {fmt} reads a file")
    log = FORMATS[fmt].read(path)
    arguments, origin = log.config, log.config_origin
    if config is not None:
        arguments, origin = read_config(Path(config), log.framework), f"--config {config}"
    elif fmt == "trl-state":
        arguments, origin = trl_args_beside(path)
    return convert(log, fmt, arguments, origin, source=str(path))


def trl_args_beside(state: Path) -> tuple[dict[str, Any] | None, str]:
    """The training arguments of a ``trainer_state.json`` from the TensorBoard events of its run:
    ``OUTPUT_DIR/runs/*/`` beside it (``trainer.save_state()``) or above it (a checkpoint's
    ``OUTPUT_DIR/checkpoint-N/``), when exactly one TensorBoard run is there (several: which one
    wrote this state is unknown, none is used) and tensorboard is installed. (None, "") otherwise."""
    beside = [state.parent] + ([state.parent.parent] if state.parent.name.startswith("checkpoint-") else [])
    for output_dir in beside:
        runs = output_dir / "runs"
        if not runs.is_dir():
            continue
        folders = {p.parent for p in runs.rglob(f"{TB_EVENTS}*") if p.is_file()}
        if len(folders) != 1:
            return None, ""
        try:
            log = read_tensorboard(folders.pop())
        except LogError:
            return None, ""
        if log.config is None:
            return None, ""
        return log.config, f"the TensorBoard args text in {runs}"
    return None, ""


# ---- the service: an authorised import into a store ----------------------------------------------------


RECIPE_SECTIONS = ("algorithm", "sampling", "optim", "train")  # the recipe's own order


def _recipe_yaml(imported: ImportedRun, name: str, source: Path, seed: int) -> str:
    recipe = {section: dict(imported.recipe[section]) for section in RECIPE_SECTIONS if section in imported.recipe}
    recipe.setdefault("train", {})["seed"] = seed
    header = (f"# Imported from {imported.format} ({imported.framework}): {json.dumps(str(source))}\n"
              "# A partial recipe: only the fields the log or its training arguments give (see the run's warnings);\n"
              "# every other field is unknown, not a workbench default.\n")
    return header + yaml.safe_dump({"name": name, **recipe}, sort_keys=False)


def _check_seed(given: int | None, logged: int | None) -> int:
    if given is not None and (isinstance(given, bool) or not isinstance(given, int) or not 0 <= given <= 2**32 - 1):
        raise LogError(f"--seed={given!r} is not allowed; an integer from 0 to {2**32 - 1}")
    if given is not None and logged is not None and given != logged:
        raise LogError(f"--seed={given} differs from the seed the run trained with (seed={logged} in its arguments); "
                       "the seed of a run is its own: leave --seed out")
    seed = given if given is not None else logged
    if seed is None:
        raise LogError("--seed is needed: the log does not say the run's seed (replicates of an arm are told apart by it)")
    return seed


def import_run(path: str | Path, *, principal: Principal, fmt: str | None = None, config: str | Path | None = None,
               group: str | None = None, arm: str | None = None, seed: int | None = None, name: str | None = None,
               tags: Iterable[str] = (), notes: str = "", store: RunRepository | None = None) -> tuple[str, list[str]]:
    """Import one log as a finished run of ``store`` owned by ``principal`` (who must be allowed to
    launch: the same rule, ``authz.RULES["launch"]``; the audit log records it as ``import``); returns
    (run id, the run's warnings). Everything is read and checked first; then the
    row (queued, without a handle: no collector or queue touches it; its launcher is not local),
    its events in one transaction (it is finished from then on), its warnings; if a write fails
    the row is removed again: a refused import leaves nothing. Importing a log already in the
    store is refused, naming its run."""
    from workbench.home import confined_path
    from workbench.runs.lifecycle import RUNS_DIR
    from workbench.runs.names import check_group, check_run_name, check_tag
    from workbench.runs.store import RunStore

    authorize(principal, "launch")
    imported = read_log(path, fmt, config)
    source = Path(path).resolve()
    group = check_group(group) if group else None
    name = check_run_name(name) if name else imported.algorithm.split(" ")[0] + "-import"
    try:
        arm = check_run_name(arm) if arm else name
    except ValueError as err:
        raise LogError(f"--arm: {err}") from None
    tags = tuple(sorted({check_tag(t) for t in tags}))
    seed = _check_seed(seed, imported.seed)
    run_id = f"{imported.framework}-import-{imported.digest[:12]}"
    store = store or RunStore()
    store.check_writable()
    _refuse_reimport(store, run_id)
    recipe_yaml = _recipe_yaml(imported, name, source, seed)
    new = NewRun(run_id=run_id, name=name, algorithm=imported.algorithm, recipe_yaml=recipe_yaml,
                 total_steps=imported.total_steps, target=IMPORT_TARGET, launcher=IMPORT_TARGET, host="",
                 created_by=principal.owner, run_dir=str(confined_path(Path(RUNS_DIR) / run_id, field="run directory")),
                 group=group, tags=tags, notes=str(notes), arm=arm,
                 launch={"imported": {"format": imported.format, "framework": imported.framework, "source": str(source),
                                      "config": imported.config_origin or None, "steps": len(imported.rows),
                                      "imported_at": time.time()}})
    try:
        store.create_runs([new])
    except RunError:
        raise
    except Exception:  # noqa: BLE001  (the id taken meanwhile by an import of the same log: say so)
        _refuse_reimport(store, run_id)
        raise
    try:
        store.ingest(run_id, _events(imported))
        store.update_run(run_id, warnings=imported.warnings)
    except BaseException:
        store.delete(run_id)
        raise
    audit.record(store, principal, "import", run_id, f"{imported.framework} {imported.format} log {source}")
    return run_id, list(imported.warnings)


def _refuse_reimport(store: RunRepository, run_id: str) -> None:
    try:
        existing = store.get_run(run_id)
    except RunError:
        return
    raise LogError(f"this log is already imported as run {run_id} (group {existing.group!r}, arm {existing.arm!r}, "
                   f"seed {existing.seed}); delete that run (`python -m workbench runs delete {run_id}`) to import it again")


def _events(imported: ImportedRun) -> list[dict[str, Any]]:
    """The run's event stream: starting, one metrics event per stored step, finished."""
    steps = sorted(imported.rows)
    first, last = imported.times[steps[0]], imported.times[steps[-1]]
    events: list[dict[str, Any]] = [{"kind": "status", "step": steps[0], "time": first, "status": "starting"},
                                    {"kind": "status", "step": steps[0], "time": first, "status": "running"}]
    events += [{"kind": "metrics", "step": s, "time": imported.times[s], "metrics": {**imported.rows[s], "step": s}}
               for s in steps]
    events.append({"kind": "status", "step": steps[-1], "time": last, "status": "finished"})
    return events
