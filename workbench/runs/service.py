"""What the CLI and the UI call: launch, cancel, delete, and keep the store in step with the runs.

``sync`` is the collector: for every active run it ingests the new events its launcher can read,
starts queued local runs when a slot is free, and gives runs whose process is gone a final status
(from their last events, the wrapper's exit code, or ``lost``) so nothing stays "running" forever.
It is safe to call from several processes at once: ingest is compare-and-set on the event offset
(``RunStore.ingest``), and queued local runs are started under one lock per store file, each after
winning a compare-and-set claim (``RunStore.claim_queued``), so a run starts exactly once.
"""

from __future__ import annotations

import getpass
import json
import logging
import math
import shutil
import threading
import time
from pathlib import Path
from dataclasses import dataclass, field
from itertools import product
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from workbench.engine import rundir
from workbench.export.commands import MIXED_PRECISION
from workbench.home import confined_path, workbench_home
from workbench.runs.launchers import LAUNCHERS, ConfigError, LaunchError, Launcher, target_scheme
from workbench.runs.names import check_group, check_run_name, check_tag, new_run_id
from workbench.runs.settings import Settings, load_settings
from workbench.runs.store import ACTIVE_STATUSES, RESUMABLE_STATUSES, TERMINAL_STATUSES, RunError, RunStore, StoreError

if TYPE_CHECKING:  # the recipe module imports the estimator registries (torch); listing runs must not
    from workbench.recipe import Recipe

RUNS_DIR = "runs"
CANCEL_GRACE_S = 10.0
# fields a comparison group forces to the first recipe's values, so curves are comparable (unless
# they are swept). The seed is not one of them: it is the replication axis (see plan_runs).
GROUP_SHARED_FIELDS = ("model", "task", "dataset", "sampling.prompts_per_step")
SEED_FIELD = "train.seed"
MAX_RUNS_PER_LAUNCH = 100  # arms x seeds of one launch: a typo in --seeds must not queue thousands of runs
ARM_SEPARATOR = " · "
QUEUE_LOCK = "queue"
log = logging.getLogger(__name__)


def launcher_for(target: str, settings: Settings | None = None) -> Launcher:
    """The launcher object of a target string ('local', 'ssh://NAME', 'slurm').

    ConfigError when the target cannot be used at all (unknown scheme, host not in settings):
    launcher constructors do no I/O, so every LaunchError they raise is about configuration.
    """
    scheme = target_scheme(target)
    if scheme not in LAUNCHERS:
        raise ConfigError(f"target={target!r} is not allowed; use one of: local, ssh://HOST (a host in settings), slurm")
    try:
        return LAUNCHERS.get(scheme)(target, settings or load_settings())
    except ConfigError:
        raise
    except LaunchError as err:
        raise ConfigError(str(err)) from err


def _host_of(target: str) -> str:
    return target.split("://", 1)[1] if "://" in target else ("localhost" if target == "local" else target)


def _inputs_key(recipe: Recipe) -> str:
    """What a run reads besides its recipe (datasets, reward functions): runs that differ only in
    their seed or algorithm read the same, and are checked once."""
    return json.dumps([recipe.task, recipe.task_config, recipe.system_prompt, recipe.dataset, recipe.eval.enabled,
                       recipe.eval.dataset, recipe.eval.num_prompts, recipe.reward_funcs, recipe.reward_weights],
                      sort_keys=True, default=str)


def check_launch_inputs(recipes: Iterable[Recipe], *, target: str = "local",
                        reward_funcs_allowed: Sequence[str] | None = None, trust_local_imports: bool = False,
                        settings: Settings | None = None) -> None:
    """Before anything is written: refuse a reward function the caller may not use, then (on this
    machine) read the datasets and resolve the reward functions as the run will (engine/precheck,
    torch-free). By default a reference that is neither a built-in nor in ``reward_funcs_allowed``
    (None: settings' ``reward_funcs_allowed``) is refused before anything is imported: importing a
    module runs its top-level code, and a caller that forgets the argument must not get Python's
    import rules. ``trust_local_imports=True`` is the CLI's explicit opt-out: the user's own
    modules, as Python imports them. Another target reads its own files and modules, so only the
    allow-list applies there. ValueError naming the field."""
    from workbench.engine.precheck import check_run_inputs, check_task_config
    from workbench.engine.rewards import check_app_reward_funcs

    recipes = list(recipes)
    if not trust_local_imports:  # every recipe, before any of them imports anything
        if reward_funcs_allowed is None:
            reward_funcs_allowed = tuple((settings or load_settings()).reward_funcs_allowed)
        for recipe in recipes:
            check_app_reward_funcs(recipe.reward_funcs, reward_funcs_allowed)
    for recipe in recipes:  # plain data, any target
        check_task_config(recipe)
    if target_scheme(target) != "local":
        return
    for recipe in {_inputs_key(r): r for r in recipes}.values():
        check_run_inputs(recipe)


def launch(recipe: Recipe, *, target: str = "local", name: str | None = None, group: str | None = None,
           tags: Iterable[str] = (), notes: str = "", created_by: str | None = None, num_processes: int = 1,
           store: RunStore | None = None, settings: Settings | None = None, arm: str | None = None,
           sweep: Mapping[str, Any] | None = None, reward_funcs_allowed: Sequence[str] | None = None,
           trust_local_imports: bool = False) -> str:
    """Check the run's inputs (``check_launch_inputs``), register it and start it (or queue it
    until a local slot is free); returns its id.

    ``arm`` (default: the run's name) and ``sweep`` (the swept values that make the arm) are
    recorded with the run; its seed is the recipe's ``train.seed``. Reward functions are held to
    settings' allow-list unless ``trust_local_imports`` (the CLI; see ``check_launch_inputs``).

    Nothing is left in the store when the target cannot take the run (unknown host, unreachable
    host, no sbatch): the error is raised and the half-made run is removed. Nor on disk when the
    store cannot take it (StoreError: read-only file): the run directory is removed again.
    """
    settings = settings or load_settings()
    check_launch_inputs([recipe], target=target, reward_funcs_allowed=reward_funcs_allowed,
                        trust_local_imports=trust_local_imports, settings=settings)
    store = store or RunStore()
    group = check_group(group) if group else None
    launcher = launcher_for(target, settings)
    row = _new_run(recipe, target=target, launcher=launcher, name=name, group=group, tags=tags, notes=notes,
                   created_by=created_by, num_processes=num_processes, arm=arm, sweep=sweep)
    return _register_and_start(store, settings, launcher, [(row, recipe)])[0]


def _new_run(recipe: Recipe, *, target: str, launcher: Launcher, name: str | None, group: str | None,
             tags: Iterable[str], notes: str, created_by: str | None, num_processes: int, arm: str | None,
             sweep: Mapping[str, Any] | None) -> dict[str, Any]:
    """The store row (``RunStore.create_run``'s arguments) of a new run; validates its name and tags."""
    from workbench.presets import algorithm_label  # the preset it is, not the run's name

    name = check_run_name(name or recipe.name)
    if num_processes < 1:
        raise RunError(f"num_processes={num_processes} is not allowed; at least 1")
    run_id = new_run_id(name)
    return dict(run_id=run_id, name=name, algorithm=algorithm_label(recipe), recipe_yaml=recipe.to_yaml(),
                total_steps=recipe.train.steps, target=target, launcher=launcher.scheme, host=_host_of(target),
                created_by=created_by or getpass.getuser(),
                run_dir=str(confined_path(Path(RUNS_DIR) / run_id, field="run directory")), group=group,
                tags=[check_tag(t) for t in tags], notes=notes, arm=arm, sweep=dict(sweep or {}),
                launch={"num_processes": num_processes, "mixed_precision": MIXED_PRECISION[recipe.train.precision]})


def _register_and_start(store: RunStore, settings: Settings, launcher: Launcher, runs: Sequence[tuple[dict, Recipe]],
                        check=None) -> list[str]:
    """Make the run directories of ``runs``, write their rows in one transaction
    (``RunStore.create_runs`` with ``check``), then start them (a remote target at once, local ones
    through the queue). Directories first: a collector may start a queued row at once, and must
    find its recipe. All or nothing: a refused check, a store that cannot be written, a directory
    that cannot be made or a remote start that fails removes every run of this call (rows and
    directories) and raises."""
    made: list[tuple[Path, bool]] = []  # (run directory, this call created it)
    try:
        for row, recipe in runs:
            run_dir = Path(row["run_dir"])
            try:  # a new (or empty) directory only; a failed prepare removes what it made and nothing else
                made.append((run_dir, rundir.prepare(run_dir, recipe.to_yaml())))
            except (OSError, rundir.RunDirError) as err:
                raise RunError(f"cannot create the run directory {run_dir}: {err}") from err
        ids = store.create_runs([row for row, _ in runs], check)
    except BaseException:
        for run_dir, created in made:  # what this call made, and only that
            if not created:
                (run_dir / rundir.RECIPE_FILE).unlink(missing_ok=True)
                continue
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    if launcher.scheme == "local":
        _start_queued_local(store, settings)
        return ids
    try:
        for run_id in ids:
            _claim_and_start(store, store.get_run(run_id), launcher)
    except BaseException:
        for run_id in ids:
            try:
                delete(run_id, store=store, settings=settings)
            except Exception:  # noqa: BLE001  (clean up the others; the first error is the one to report)
                log.exception("could not remove run %s of a launch that failed", run_id)
        raise
    return ids


# -- arms x seeds: plan (pure, validated, torch-free), then launch ----------------------------------
@dataclass(frozen=True)
class PlannedRun:
    """One run of a launch: its arm label, seed, the recipe it trains (``train.seed == seed``) and
    the swept values that make its arm (dotted field -> value; {} without a sweep)."""

    arm: str
    seed: int
    recipe: Recipe
    sweep: dict[str, Any] = field(default_factory=dict)


def parse_sweep(items: Iterable[str]) -> dict[str, list[Any]]:
    """CLI ``--sweep FIELD=V1,V2`` items (and the Launch page's "Values of FIELD" boxes) ->
    {dotted field: [values]}; each value list is read as one YAML flow sequence by the limited
    loader (workbench.yamlsafe: no aliases, bounded depth and integer length), so
    ``optim.betas=[0.9,0.99],[0.9,0.999]`` sweeps two pairs and a hostile list is one RunError
    naming the field, not a traceback or minutes of expansion."""
    from workbench.yamlsafe import YamlInputError, load_yaml, short

    sweep: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or not raw.strip():
            raise RunError(f"--sweep {short(item)} is not allowed; expected FIELD=V1,V2,..., e.g. algorithm.eps_high=0.2,0.28")
        try:
            values = load_yaml(f"[{raw}]", root=key)
        except YamlInputError as err:
            if str(err).startswith("not valid YAML"):
                raise RunError(f"--sweep {short(item)}: the values are not a valid YAML list ({str(err)[16:-1]})") from None
            raise RunError(f"--sweep {short(key, 40)}: {err}") from None
        if key in sweep:
            raise RunError(f"--sweep {key} is given twice; list every value in one --sweep {key}=V1,V2")
        sweep[key] = values
    return sweep


def _format_value(value: Any) -> str:
    """A swept value as an arm label shows it: YAML spelling for true/false/null and lists, str otherwise."""
    return json.dumps(value) if value is None or isinstance(value, (bool, list, dict)) else str(value)


def _arm_label(base: str, point: Mapping[str, Any]) -> str:
    """'grpo' + {algorithm.eps_high: 0.28, algorithm.aggregation: 'token-mean'} ->
    'grpo · eps_high=0.28 · aggregation=token-mean' (the field's last part; the whole path where
    two swept fields share it)."""
    leaves = [key.rsplit(".", 1)[-1] for key in point]
    names = [leaf if leaves.count(leaf) == 1 else key for key, leaf in zip(point, leaves)]
    return ARM_SEPARATOR.join([base, *(f"{n}={_format_value(v)}" for n, v in zip(names, point.values()))])


def _check_sweep(sweep: Mapping[str, Sequence[Any]], recipe: Recipe) -> dict[str, list[Any]]:
    """Swept fields exist in ``recipe`` (not the seed), each with distinct values."""
    checked = {}
    for key, values in sweep.items():
        values = list(values) if isinstance(values, (list, tuple)) else [values]
        node, parts = recipe.to_dict(), key.split(".")
        for depth, part in enumerate(parts):
            if not isinstance(node, dict) or part not in node:
                where = ".".join(parts[:depth]) or "the recipe"
                known = ", ".join(node) if isinstance(node, dict) else "(none: not a section)"
                raise RunError(f"--sweep {key}: unknown field; fields of {where}: {known}")
            node = node[part]
        if key == SEED_FIELD:
            raise RunError(f"--sweep {SEED_FIELD} is not allowed: the seed is the replication axis; use --seeds N")
        if not values:
            raise RunError(f"--sweep {key} has no values; give at least one")
        shown = [_format_value(v) for v in values]
        repeated = sorted({v for v in shown if shown.count(v) > 1})
        if repeated:
            raise RunError(f"--sweep {key} lists {', '.join(repeated)} twice; each value makes one arm")
        checked[key] = values
    return checked


def _base_recipes(sources: Sequence[str | Recipe], overrides: Sequence[str]) -> list[tuple[str, Recipe]]:
    """(arm base label, recipe) per source: a preset name is its own label, a YAML file or a Recipe
    object is labelled by its ``name``. ``overrides`` (``--set``) apply to every source."""
    from workbench.recipe import load_recipe

    bases = []
    for source in sources:
        if isinstance(source, str):
            recipe = load_recipe(source, list(overrides))
            label = source if Path(source).suffix not in (".yaml", ".yml") else recipe.name
        else:
            recipe, label = (source.with_overrides(list(overrides)) if overrides else source), source.name
        bases.append((label, recipe))
    labels = [label for label, _ in bases]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise RunError(f"recipes {', '.join(map(repr, twice))} appear twice in one launch; each arm needs its own "
                       "name (rename one with --set name=...)")
    return bases


def plan_runs(sources: Sequence[str | Recipe], *, seeds: int = 1, sweep: Mapping[str, Sequence[Any]] | None = None,
              overrides: Sequence[str] = (), target: str = "local", num_processes: int = 1) -> list[PlannedRun]:
    """Every run of a launch, each one validated, before anything starts (pure; no torch, no store).

    arms = sources x the grid of ``sweep`` ({dotted field: [values]}); every arm runs with seeds
    s0, s0 + 1, ..., s0 + seeds - 1, where s0 is the first recipe's ``train.seed``, so seed k of
    every arm shares its sampling and data order (paired seeds). ``GROUP_SHARED_FIELDS`` that are
    not swept are forced to the first recipe's values. Each (arm, seed) recipe is validated
    (Recipe's bounds; this machine's CPUs/GPUs for a local ``target``): the first invalid one is a
    RecipeError naming its arm and seed, and nothing is returned.

    Returns len(sources) x prod(len(values)) x seeds PlannedRun, arm-major, seeds ascending.
    """
    from workbench.machine import check_fits_machine
    from workbench.recipe import RecipeError
    from workbench.runs.launchers import target_scheme

    if not sources:
        raise RunError("a launch needs at least one recipe")
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise RunError(f"--seeds={seeds!r} is not allowed; a whole number of seeds per arm, at least 1")
    arms = len(sources) * math.prod(len(v) if isinstance(v, (list, tuple)) else 1 for v in (sweep or {}).values())
    if arms * seeds > MAX_RUNS_PER_LAUNCH:
        raise RunError(f"this launch would create {arms} arms x {seeds} seeds = {arms * seeds} runs; at most "
                       f"{MAX_RUNS_PER_LAUNCH} per launch: use fewer seeds, recipes or sweep values")
    bases = _base_recipes(sources, overrides)
    first = bases[0][1]
    grid = _check_sweep(sweep or {}, first)
    shared = [f"{key}={_yaml_text(_get(first, key))}" for key in GROUP_SHARED_FIELDS
              if key not in grid and _get(first, key) is not None]
    check_machine = target_scheme(target) == "local"  # elsewhere the machine is not known here
    planned = []
    for label, base in bases:
        aligned = base.with_overrides(shared) if shared and len(bases) > 1 else base
        for values in product(*grid.values()):
            point = dict(zip(grid, values))
            arm = _arm_label(label, point)
            for seed in range(first.train.seed, first.train.seed + seeds):
                items = [f"{key}={_yaml_text(value)}" for key, value in point.items()] + [f"{SEED_FIELD}={seed}"]
                try:
                    recipe = aligned.with_overrides(items)
                    if check_machine:
                        check_fits_machine(recipe, num_processes)
                except RecipeError as err:
                    if arms * seeds == 1:  # the only run: the recipe's own message says it all
                        raise
                    raise RecipeError(f"arm {arm!r} seed {seed} is not allowed: {err}") from None
                planned.append(PlannedRun(arm=arm, seed=seed, recipe=recipe, sweep=point))
    return planned


def _yaml_text(value: Any) -> str:
    """A value as ``with_overrides`` reads it back (JSON is YAML): 0.28, "token-mean", [0.9, 0.99]."""
    return json.dumps(value)


def launch_planned(planned: Sequence[PlannedRun], *, group: str | None = None, target: str = "local",
                   tags: Iterable[str] = (), notes: str = "", created_by: str | None = None, num_processes: int = 1,
                   store: RunStore | None = None, settings: Settings | None = None,
                   reward_funcs_allowed: Sequence[str] | None = None, trust_local_imports: bool = False) -> list[str]:
    """Launch the runs of ``plan_runs`` as one comparison group (``group`` may be None for a single
    run); returns their ids in plan order. Every run's inputs are checked first
    (``check_launch_inputs``: nothing is written when one fails; reward functions held to
    settings' allow-list unless ``trust_local_imports``). All or nothing: if one cannot be
    launched, the runs this call already made are deleted (cancelled first) and the error is raised."""
    if not planned:
        raise RunError("nothing to launch: the plan has no runs")
    if len(planned) > 1 and not group:
        raise RunError(f"launching {len(planned)} runs needs a comparison group name")
    if group:
        check_group(group)
    tags = [check_tag(t) for t in tags]
    store = store or RunStore()
    settings = settings or load_settings()
    store.check_writable()
    launcher = launcher_for(target, settings)  # an unknown target fails before the first run is made
    check_launch_inputs([run.recipe for run in planned], target=target, reward_funcs_allowed=reward_funcs_allowed,
                        trust_local_imports=trust_local_imports, settings=settings)
    runs = [(_new_run(run.recipe, target=target, launcher=launcher, name=None, group=group, tags=tags, notes=notes,
                      created_by=created_by, num_processes=num_processes, arm=run.arm, sweep=run.sweep), run.recipe)
            for run in planned]
    check = (lambda arms: _check_joins_group(arms[group], group, planned)) if group else None
    return _register_and_start(store, settings, launcher, runs, check)


def _check_joins_group(arms: Mapping[str, list[dict]], group: str, planned: Sequence[PlannedRun]) -> None:
    """Runs added to an existing group keep its arms honest: an arm label already there must mean
    the same recipe minus its seed, and a seed it already has would be a copy, not a replicate.
    ``arms``: the group's arms as ``RunStore.create_runs`` reads them inside the transaction that
    inserts the new runs, so a launch racing with this one cannot slip a seed in between."""
    import yaml

    for arm, runs in arms.items():
        mine = [p for p in planned if p.arm == arm]
        if not mine:
            continue
        theirs = _with_defaults(yaml.safe_load(runs[0]["recipe"]) or {})
        differs = _differing_fields(_without_seed(theirs), _without_seed(mine[0].recipe.to_dict()))
        if differs:
            key, old, new = differs[0]
            raise RunError(f"group {group!r} already has arm {arm!r} with {key}={old!r}, this launch has {key}={new!r}; "
                           "launch into another group or give the recipe another name (--set name=...)")
        taken = sorted({p.seed for p in mine} & {r["seed"] for r in runs})
        if taken:
            raise RunError(f"group {group!r} already has arm {arm!r} with seed(s) {taken}: a run with the same seed is "
                           f"a copy, not a replicate; add seeds with --set {SEED_FIELD}={max(r['seed'] or 0 for r in runs) + 1}")


def _with_defaults(data: dict) -> dict:
    """A stored recipe with the fields this version added filled in (as is if it no longer validates)."""
    from workbench.recipe import Recipe, RecipeError

    try:
        return Recipe.from_dict(data).to_dict()
    except RecipeError:
        return data


def _without_seed(recipe: dict) -> dict:
    section, key = SEED_FIELD.split(".")
    return {**recipe, section: {k: v for k, v in (recipe.get(section) or {}).items() if k != key}}


def _differing_fields(a: Any, b: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted field, value in a, value in b) wherever two recipe dicts differ, in field order."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [] if a == b else [(prefix, a, b)]
    return [d for key in dict.fromkeys([*a, *b])
            for d in _differing_fields(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else key)]


def launch_group(recipes: Sequence[str | Recipe], *, group: str, target: str = "local", created_by: str | None = None,
                 store: RunStore | None = None, settings: Settings | None = None, seeds: int = 1,
                 sweep: Mapping[str, Sequence[Any]] | None = None, num_processes: int = 1, **kwargs) -> list[str]:
    """Launch recipes side by side as one comparison group (shared model and prompts, paired seeds):
    ``plan_runs`` then ``launch_planned``."""
    check_group(group)
    planned = plan_runs(recipes, seeds=seeds, sweep=sweep, target=target, num_processes=num_processes)
    return launch_planned(planned, group=group, target=target, created_by=created_by, num_processes=num_processes,
                          store=store, settings=settings, **kwargs)


def _get(recipe: Recipe, dotted: str):
    value = recipe
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _claim_and_start(store: RunStore, run: dict, launcher: Launcher) -> bool:
    """Start a queued run if this caller wins its claim (False: another caller did, or it was
    cancelled first). The handle is recorded before ``cancel_requested`` is read, and ``cancel``
    sets that flag before it reads the handle, so a cancel racing with the start is never lost:
    one of the two sides sees the other and stops the process."""
    if not store.claim_queued(run["id"]):
        return False
    _start_claimed(store, run, launcher)
    return True


def usable_gpus(gpu_slots: int | None, visible: list[int]) -> list[int]:
    """The GPUs local runs may take: the first ``gpu_slots`` visible devices (None: all; 0: none,
    every local run then uses the CPU slots). See ``Settings.gpu_slots``."""
    return list(visible) if gpu_slots is None else list(visible[:gpu_slots])


def _needs(run: dict) -> int:
    return int(run["launch"].get("num_processes", 1))


def _start_queued_local(store: RunStore, settings: Settings) -> int:
    """Start queued local runs while slots are free (FIFO); returns how many started.

    One caller at a time per store file (a lock shared by every process), so the slot count it
    reads cannot change under it except by runs ending.
    """
    with store.lock(QUEUE_LOCK):
        local = [r for r in store.runs(ACTIVE_STATUSES) if r["launcher"] == "local"]
        queued = [r for r in local if r["status"] == "queued"]
        claimed = [r for r in local if r["status"] != "queued"]
        running = [r for r in claimed if not _drop_orphaned_claim(store, r)]
        if not queued:
            return 0
        from workbench.machine import visible_gpus  # here: the recipe schema it imports loads only for a queued run

        usable = usable_gpus(settings.gpu_slots, visible_gpus(torch_on_rocm=True))
        launcher = launcher_for("local", settings)
        started = 0
        for run in queued:
            if run["cancel_requested"]:  # a cancel that stopped half-way: finish it
                store.cancel_queued(run["id"])
                continue
            placement = _place(run, running, usable, settings)
            if placement is _WAIT:
                break
            if isinstance(placement, str):
                store.set_status(run["id"], "failed", error=placement)
                continue
            if not store.claim_queued(run["id"]):
                continue  # cancelled meanwhile
            if placement:
                run["launch"]["gpus"] = placement
                store.update_run(run["id"], launch=run["launch"])
            try:
                _start_claimed(store, run, launcher)
            except LaunchError as err:
                store.set_status(run["id"], "failed", error=str(err))
                continue
            running.append(store.get_run(run["id"]))
            started += 1
        return started


def _start_claimed(store: RunStore, run: dict, launcher: Launcher) -> None:
    """Start a run this caller has claimed and record its handle; then honour a cancel that came
    while it was starting (that cancel saw no handle to signal)."""
    store.update_run(run["id"], handle=launcher.start(run))
    current = store.get_run(run["id"])
    if current["cancel_requested"]:
        launcher.cancel(current, CANCEL_GRACE_S)


def _drop_orphaned_claim(store: RunStore, run: dict) -> bool:
    """A claimed local run without a handle, seen under the queue lock: its claimer died between
    the claim and recording the process (claims and handles are only written under that lock).
    Marks it ``lost``; True if it was one."""
    if run["status"] != "starting" or run["handle"]:
        return False
    store.set_status(run["id"], "lost", error="the process starting this run ended before recording it")
    return True


_WAIT = object()  # placement: not now, keep the queue order


def _place(run: dict, running: list[dict], usable: list[int], settings: Settings):
    """Where a queued run can go now: its GPU list (``[]``: CPU), ``_WAIT``, or an error message
    when it can never start here."""
    need = _needs(run)
    if usable:
        if need > len(usable):
            return (f"this run needs {need} GPUs (one per process) but only {len(usable)} can be used here "
                    f"(gpu_slots={settings.gpu_slots}, visible: {usable}); launch it with at most {len(usable)} processes")
        busy = {g for r in running for g in r["launch"].get("gpus", [])}
        free = [g for g in usable if g not in busy]
        return free[:need] if len(free) >= need else _WAIT
    on_cpu = [r for r in running if not r["launch"].get("gpus")]
    if on_cpu and sum(_needs(r) for r in on_cpu) + need > settings.cpu_slots:
        return _WAIT
    return []


def _ingest_new(store: RunStore, run: dict, launcher: Launcher) -> int:
    """Ingest what the launcher reads past the run's offset (and the file identity it read it
    from: a local events file replaced by a rename is read again, see ``read_file_events``)."""
    chunk = launcher.read_events(run)
    old, old_inode = int(run["events_offset"]), run.get("events_inode")
    new_inode = chunk.inode or old_inode
    if chunk.offset == old and chunk.warning is None and new_inode == old_inode:
        return 0
    return store.ingest(run["id"], chunk.events, offset=(old, chunk.offset), inode=(old_inode, new_inode),
                        warning=chunk.warning)


def _finalise(store: RunStore, run_id: str, launcher: Launcher) -> None:
    """The process is gone and wrote no final status: decide one from what is known."""
    run = store.get_run(run_id)
    if run["status"] in TERMINAL_STATUSES:
        return
    status, error = launcher.exit_status(run)
    if run["cancel_requested"]:
        status, error = "cancelled", error or "cancelled by the user"
    if status is None:
        status, error = "lost", "the run's process ended without a final status event"
    store.set_status(run_id, status, error=error)


_last_alive: dict[tuple[str, str], float] = {}  # (store file, run id) -> monotonic time of the last alive()


def alive_check_due(last_checked: float | None, now: float, every_s: float) -> bool:
    """Whether the collector should ask the launcher ``alive`` again (at most once per ``every_s``)."""
    return last_checked is None or now - last_checked >= every_s


def sync(store: RunStore | None = None, settings: Settings | None = None) -> int:
    """Ingest every active run's new events and reconcile; returns the number of new rows.

    A run whose target no longer exists in the settings becomes ``lost``; an unreachable one is
    retried next time; any other failure of one run is logged and does not stop the others.
    A store that cannot be written raises StoreError at once: a collector that cannot record
    anything must say so, not report "0 rows".
    """
    store = store or RunStore()
    settings = settings or load_settings()
    store.check_writable()
    new = 0
    for run in store.runs(ACTIVE_STATUSES):
        if not run["handle"]:
            continue  # queued, or being started by the queue right now
        try:
            new += _sync_run(store, run, settings)
        except StoreError:
            raise  # the file, not this run: every other run would fail the same way
        except ConfigError as err:
            _lose(store, run["id"], err)
        except LaunchError:
            continue  # unreachable now; try again next time rather than declare the run lost
        except Exception:  # noqa: BLE001  (one broken run must not stop the collector for all the others)
            log.exception("syncing run %s failed; the next pass retries it", run["id"])
    _start_queued_local(store, settings)
    return new


def _lose(store: RunStore, run_id: str, err: ConfigError) -> None:
    """The run's target is gone from the settings: nothing can follow or stop it any more."""
    store.set_status(run_id, "lost", error=f"cannot follow this run any more: {err}")


def _sync_run(store: RunStore, run: dict, settings: Settings) -> int:
    launcher = launcher_for(run["target"], settings)
    key = (str(store.path), run["id"])
    new = _ingest_new(store, run, launcher)
    if store.get_run(run["id"])["status"] in TERMINAL_STATUSES:
        _last_alive.pop(key, None)
        return new
    now = time.monotonic()
    if not alive_check_due(_last_alive.get(key), now, getattr(launcher, "alive_every_s", 0.0)):
        return new
    _last_alive[key] = now
    if launcher.alive(run) is False:
        new += _ingest_new(store, store.get_run(run["id"]), launcher)  # lines written while it exited
        _finalise(store, run["id"], launcher)
        _last_alive.pop(key, None)
    return new


def cancel(run_id: str, *, store: RunStore | None = None, settings: Settings | None = None, wait: bool = True,
           grace_s: float = CANCEL_GRACE_S) -> None:
    """Stop a run: SIGTERM (the trainer records ``cancelled``), SIGKILL after ``grace_s``.

    A queued run is cancelled without starting (compare-and-set against the queue's claim); one
    that the queue is starting right now is cancelled by the queue once its process is recorded.
    ``wait=False`` returns at once (the UI) and finishes the escalation in a background thread.
    """
    store = store or RunStore()
    if store.get_run(run_id)["status"] in TERMINAL_STATUSES or store.cancel_queued(run_id):
        return
    store.update_run(run_id, cancel_requested=1)  # before reading the handle (see _claim_and_start)
    run = store.get_run(run_id)
    if not run["handle"] or run["status"] in TERMINAL_STATUSES:
        return
    try:
        launcher = launcher_for(run["target"], settings)
    except ConfigError as err:
        _lose(store, run_id, err)  # so that it can still be deleted
        return
    _last_alive.pop((str(store.path), run_id), None)  # the next sync asks at once
    if wait:
        launcher.cancel(run, grace_s)
        sync(store, settings)
    else:
        threading.Thread(target=launcher.cancel, args=(run, grace_s), daemon=True).start()


def resume(run_id: str, *, store: RunStore | None = None, settings: Settings | None = None):
    """Continue a failed, cancelled or lost run from its newest checkpoint, as the same run: same
    id, store row and run directory (on the run's own target); its trainer (``train --resume
    RUN_DIR``) appends to the same event stream and its ``resume`` event replaces the rows the
    attempt before logged after that checkpoint (``RunStore.ingest``). Without a checkpoint it
    starts again at step 0. A local run is queued again and starts when a slot is free; an ssh or
    SLURM run is started at once by its launcher (a new wrapper in the same remote directory, a new
    job for the same run dir) and a start that fails leaves the run ``failed``, resumable again.

    Returns (step, path) of the checkpoint it continues from (path on the run's machine), or None.
    """
    store = store or RunStore()
    settings = settings or load_settings()
    store.check_writable()
    run = store.get_run(run_id)
    if run["status"] not in RESUMABLE_STATUSES:
        raise RunError(f"run {run_id} is {run['status']}; only {', '.join(RESUMABLE_STATUSES)} runs can be resumed")
    launcher = launcher_for(run["target"], settings)
    alive = launcher.alive(run)
    if alive is None:
        raise LaunchError(f"run {run_id}: cannot tell now whether its processes on {run['target']} have ended "
                          "(unreachable); nothing was changed, try again later")
    if alive:
        raise RunError(f"run {run_id} still has processes running; cancel it before resuming")
    # previous_handle: where the attempt before ran (kept across a resume whose start failed)
    previous = run["handle"] or run["launch"].get("previous_handle") or {}
    launch = {k: v for k, v in run["launch"].items() if k != "gpus"}  # placed again by the queue
    checkpoint = launcher.latest_checkpoint({**run, "handle": previous})
    store.reopen(run_id, {**launch, "resume": True, "previous_handle": previous})
    if launcher.scheme == "local":
        _start_queued_local(store, settings)
        return checkpoint
    try:
        _claim_and_start(store, store.get_run(run_id), launcher)
    except LaunchError as err:
        store.set_status(run_id, "failed", error=f"resume failed: {err}")
        raise
    return checkpoint


def model_outputs(run: dict) -> dict[str, Any]:
    """Where a run's trained policy is (paths on this machine; the run dir of a remote run is the
    launcher's local mirror): ``final`` (the HF directory of a finished run, or None) and
    ``checkpoint`` ((step, path) of the newest checkpoint, or None; a resume continues after it)."""
    from workbench.engine.checkpoint import final_model_dir, latest_checkpoint

    run_dir = Path(run["run_dir"])
    return {"final": final_model_dir(run_dir), "checkpoint": latest_checkpoint(run_dir)}


def delete(run_id: str, *, store: RunStore | None = None, settings: Settings | None = None) -> None:
    """Cancel if still active, then remove the run from the store and its local directory."""
    store = store or RunStore()
    run = store.get_run(run_id)
    if run["status"] in ACTIVE_STATUSES:
        cancel(run_id, store=store, settings=settings, grace_s=3.0)
    store.delete(run_id)
    run_dir = Path(run["run_dir"])
    runs_root = workbench_home() / RUNS_DIR
    if runs_root in run_dir.resolve().parents:  # never remove anything outside the home's runs/
        shutil.rmtree(run_dir, ignore_errors=True)


def wait(run_id: str, *, store: RunStore | None = None, settings: Settings | None = None, poll_s: float = 0.5,
         timeout_s: float | None = None, on_step=None) -> str:
    """Sync until the run reaches a final status; returns it (``on_step(run)`` after each sync)."""
    store = store or RunStore()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        sync(store, settings)
        run = store.get_run(run_id)
        if on_step is not None:
            on_step(run)
        if run["status"] in TERMINAL_STATUSES:
            return run["status"]
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still {run['status']} after {timeout_s} s")
        time.sleep(poll_s)


_collectors: dict[str, threading.Thread] = {}
_collectors_lock = threading.Lock()


def ensure_collector(store: RunStore | None = None, interval_s: float = 0.25) -> threading.Thread:
    """One background collector thread per store file in this process (the app starts it)."""
    store = store or RunStore()
    key = str(store.path)
    with _collectors_lock:
        thread = _collectors.get(key)
        if thread is None or not thread.is_alive():
            thread = threading.Thread(target=_collect_forever, args=(store, interval_s), daemon=True,
                                      name=f"workbench-collector:{key}")
            thread.start()
            _collectors[key] = thread
    return thread


def _collect_forever(store: RunStore, interval_s: float) -> None:
    """Sync every ``interval_s``; back off (up to 30 s) while syncing fails; stop if the home is gone."""
    delay = interval_s
    while store.path.parent.exists():
        try:
            sync(store)
            delay = interval_s
        except Exception:  # noqa: BLE001  (bad settings must not kill the collector; the next pass retries)
            log.exception("collector pass failed; retrying in %.1f s", min(30.0, delay * 2))
            delay = min(30.0, delay * 2)
        time.sleep(delay)
    with _collectors_lock:
        _collectors.pop(str(store.path), None)
