"""A run's life, as the acting principal asks for it: launch (one run, a plan, a group), cancel,
resume, delete, edit (name, tags, notes), and saving the workbench settings.

Every action takes ``principal`` (``workbench.runs.authz.Principal``: who acts, with which role)
and is authorised (``authz.authorize``) before anything is read from a target or written: a
refusal is ``PermissionDenied`` and leaves the store, the run directories and the settings file as
they were. What a new run records as its owner (``created_by``) is the principal's ``owner``. The UI,
the CLI and any later API call these functions, so the rule is written once. Each action that
succeeds adds one entry to the audit log (``workbench.runs.audit``: who, when, what, from where).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from workbench.engine import rundir
from workbench.export.commands import MIXED_PRECISION
from workbench.home import confined_path, workbench_home
from workbench.runs import audit
from workbench.runs.authz import Principal, authorize
from workbench.runs.collector import forget_alive_check, lose, sync
from workbench.runs.confinement import check_app_paths
from workbench.runs.launchers import ConfigError, LaunchError, Launcher, target_scheme
from workbench.runs.names import check_group, check_run_name, check_tag, new_run_id
from workbench.runs.planning import PlannedRun, check_joins_group, plan_runs
from workbench.runs.records import ACTIVE_STATUSES, RESUMABLE_STATUSES, NewRun, Run, RunError, RunRepository
from workbench.runs.scheduler import CANCEL_GRACE_S, claim_and_start, launcher_for, start_queued_local
from workbench.runs.settings import Settings, SettingsError, load_settings, save_settings
from workbench.runs.store import RunStore, default_store, recipe_seed

if TYPE_CHECKING:  # the recipe module imports the estimator registries (torch); listing runs must not
    from workbench.recipe import Recipe

RUNS_DIR = "runs"
log = logging.getLogger(__name__)


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
    import rules; likewise a dataset or model path outside the workbench home is refused
    (``confinement``). ``trust_local_imports=True`` is the CLI's explicit opt-out: the user's own
    modules and files, as Python imports and reads them. Another target reads its own files and modules, so only the
    allow-list applies there. ValueError naming the field."""
    from workbench.engine.precheck import check_run_inputs, check_task_config
    from workbench.engine.rewards import check_app_reward_funcs

    recipes = list(recipes)
    if not trust_local_imports:  # every recipe, before any of them imports or reads anything
        if reward_funcs_allowed is None:
            reward_funcs_allowed = tuple((settings or load_settings()).reward_funcs_allowed)
        for recipe in recipes:
            check_app_reward_funcs(recipe.reward_funcs, reward_funcs_allowed)
            check_app_paths(recipe)
    for recipe in recipes:  # plain data, any target
        check_task_config(recipe)
    if target_scheme(target) != "local":
        return
    for recipe in {_inputs_key(r): r for r in recipes}.values():
        check_run_inputs(recipe)


def launch(recipe: Recipe, *, principal: Principal, target: str = "local", name: str | None = None,
           group: str | None = None, tags: Iterable[str] = (), notes: str = "", num_processes: int = 1,
           store: RunRepository | None = None, settings: Settings | None = None, arm: str | None = None,
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
    ``principal`` must be allowed to launch (``authz.RULES["launch"]``); it owns the run.
    """
    authorize(principal, "launch")
    settings = settings or load_settings()
    check_launch_inputs([recipe], target=target, reward_funcs_allowed=reward_funcs_allowed,
                        trust_local_imports=trust_local_imports, settings=settings)
    store = store or RunStore()
    group = check_group(group) if group else None
    launcher = launcher_for(target, settings)
    row = _new_run(recipe, target=target, launcher=launcher, name=name, group=group, tags=tags, notes=notes,
                   created_by=principal.owner, num_processes=num_processes, arm=arm, sweep=sweep)
    run_id = _register_and_start(store, settings, launcher, [(row, recipe)], principal)[0]
    audit.record(store, principal, "launch", run_id, _launch_detail([row], target, group))
    return run_id


def _launch_detail(rows: Sequence[NewRun], target: str, group: str | None) -> str:
    """What a launch started, for the audit log: where, which group, the arms and their seeds."""
    arms: dict[str, list[str]] = {}
    for row in rows:
        seed = recipe_seed(row.recipe_yaml)
        arms.setdefault(row.arm or row.name, []).append(str(seed))
    named = "; ".join(f"{arm} (seeds {', '.join(seeds)})" for arm, seeds in arms.items())
    return f"{len(rows)} run{'s' if len(rows) != 1 else ''} on {target}" + (f" in group {group}" if group else "") + f": {named}"


def _new_run(recipe: Recipe, *, target: str, launcher: Launcher, name: str | None, group: str | None,
             tags: Iterable[str], notes: str, created_by: str, num_processes: int, arm: str | None,
             sweep: Mapping[str, Any] | None) -> NewRun:
    """The store row of a new run; validates its name and tags."""
    from workbench.presets import algorithm_label  # the preset it is, not the run's name

    name = check_run_name(name or recipe.name)
    if num_processes < 1:
        raise RunError(f"num_processes={num_processes} is not allowed; at least 1")
    run_id = new_run_id(name)
    return NewRun(run_id=run_id, name=name, algorithm=algorithm_label(recipe), recipe_yaml=recipe.to_yaml(),
                  total_steps=recipe.train.steps, target=target, launcher=launcher.scheme, host=_host_of(target),
                  created_by=created_by, run_dir=str(confined_path(Path(RUNS_DIR) / run_id, field="run directory")),
                  group=group, tags=tuple(check_tag(t) for t in tags), notes=notes, arm=arm, sweep=dict(sweep or {}),
                  launch={"num_processes": num_processes, "mixed_precision": MIXED_PRECISION[recipe.train.precision]})


def _register_and_start(store: RunRepository, settings: Settings, launcher: Launcher,
                        runs: Sequence[tuple[NewRun, Recipe]], principal: Principal, check=None) -> list[str]:
    """Make the run directories of ``runs``, write their rows in one transaction
    (``RunStore.create_runs`` with ``check``), then start them (a remote target at once, local ones
    through the queue). Directories first: a collector may start a queued row at once, and must
    find its recipe. All or nothing: a refused check, a store that cannot be written, a directory
    that cannot be made or a remote start that fails removes every run of this call (rows and
    directories) and raises."""
    made: list[tuple[Path, bool]] = []  # (run directory, this call created it)
    try:
        for row, recipe in runs:
            run_dir = Path(row.run_dir)
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
        start_queued_local(store, settings)
        return ids
    try:
        for run_id in ids:
            claim_and_start(store, store.get_run(run_id), launcher)
    except BaseException:
        for run_id in ids:
            try:
                delete(run_id, principal=principal, store=store, settings=settings)
            except Exception:  # noqa: BLE001  (clean up the others; the first error is the one to report)
                log.exception("could not remove run %s of a launch that failed", run_id)
        raise
    return ids


def launch_planned(planned: Sequence[PlannedRun], *, principal: Principal, group: str | None = None,
                   target: str = "local", tags: Iterable[str] = (), notes: str = "", num_processes: int = 1,
                   store: RunRepository | None = None, settings: Settings | None = None,
                   reward_funcs_allowed: Sequence[str] | None = None, trust_local_imports: bool = False) -> list[str]:
    """Launch the runs of ``plan_runs`` as one comparison group (``group`` may be None for a single
    run); returns their ids in plan order. Every run's inputs are checked first
    (``check_launch_inputs``: nothing is written when one fails; reward functions held to
    settings' allow-list unless ``trust_local_imports``). All or nothing: if one cannot be
    launched, the runs this call already made are deleted (cancelled first) and the error is raised.
    ``principal`` must be allowed to launch; it owns the runs."""
    authorize(principal, "launch")
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
                      created_by=principal.owner, num_processes=num_processes, arm=run.arm, sweep=run.sweep), run.recipe)
            for run in planned]
    check = (lambda arms: check_joins_group(arms[group], group, planned)) if group else None
    ids = _register_and_start(store, settings, launcher, runs, principal, check)
    audit.record(store, principal, "launch", ",".join(ids), _launch_detail([row for row, _ in runs], target, group))
    return ids


def launch_group(recipes: Sequence[str | Recipe], *, principal: Principal, group: str, target: str = "local",
                 store: RunRepository | None = None, settings: Settings | None = None, seeds: int = 1,
                 sweep: Mapping[str, Sequence[Any]] | None = None, num_processes: int = 1, **kwargs) -> list[str]:
    """Launch recipes side by side as one comparison group (shared model and prompts, paired seeds):
    ``plan_runs`` then ``launch_planned`` (as ``principal``, who must be allowed to launch)."""
    authorize(principal, "launch")
    check_group(group)
    planned = plan_runs(recipes, seeds=seeds, sweep=sweep, target=target, num_processes=num_processes)
    return launch_planned(planned, principal=principal, group=group, target=target, num_processes=num_processes,
                          store=store, settings=settings, **kwargs)


def cancel(run_id: str, *, principal: Principal, store: RunRepository | None = None, settings: Settings | None = None,
           wait: bool = True, grace_s: float = CANCEL_GRACE_S) -> None:
    """Stop a run: SIGTERM (the trainer records ``cancelled``), SIGKILL after ``grace_s``.

    A queued run is cancelled without starting (compare-and-set against the queue's claim); one
    that the queue is starting right now is cancelled by the queue once its process is recorded.
    ``wait=False`` returns at once (the UI) and finishes the escalation in a background thread.
    ``principal`` must be allowed to cancel this run (its owner, or an admin).
    """
    store = store or RunStore()
    run = store.get_run(run_id)
    authorize(principal, "cancel", run)
    outcome = _cancel(store, run, settings, wait, grace_s)
    audit.record(store, principal, "cancel", run_id, outcome)


def _cancel(store: RunRepository, run: Run, settings: Settings | None, wait: bool, grace_s: float) -> str:
    """``cancel`` once authorised; returns what it did (for the audit log)."""
    run_id = run.id
    if run.terminal:
        return f"already {run.status}"
    if store.cancel_queued(run_id):
        return "cancelled before it started"
    store.update_run(run_id, cancel_requested=1)  # before reading the handle (see claim_and_start)
    run = store.get_run(run_id)
    if not run.handle or run.terminal:
        return "cancel requested" if not run.terminal else f"already {run.status}"
    try:
        launcher = launcher_for(run.target, settings)
    except ConfigError as err:
        lose(store, run_id, err)  # so that it can still be deleted
        return f"lost: {err}"
    forget_alive_check(store, run_id)  # the next sync asks at once
    if wait:
        launcher.cancel(run, grace_s)
        sync(store, settings)
    else:
        threading.Thread(target=launcher.cancel, args=(run, grace_s), daemon=True).start()
    return f"stopping on {run.target} (TERM, KILL after {grace_s:g} s)"


def resume(run_id: str, *, principal: Principal, store: RunRepository | None = None, settings: Settings | None = None):
    """Continue a failed, cancelled or lost run from its newest checkpoint, as the same run: same
    id, store row and run directory (on the run's own target); its trainer (``train --resume
    RUN_DIR``) appends to the same event stream and its ``resume`` event replaces the rows the
    attempt before logged after that checkpoint (``RunStore.ingest``). Without a checkpoint it
    starts again at step 0. A local run is queued again and starts when a slot is free; an ssh or
    SLURM run is started at once by its launcher (a new wrapper in the same remote directory, a new
    job for the same run dir) and a start that fails leaves the run ``failed``, resumable again.

    Returns (step, path) of the checkpoint it continues from (path on the run's machine), or None.
    ``principal`` must be allowed to resume this run (its owner, or an admin).
    """
    store = store or RunStore()
    run = store.get_run(run_id)
    authorize(principal, "resume", run)
    settings = settings or load_settings()
    store.check_writable()
    if run.status not in RESUMABLE_STATUSES:
        raise RunError(f"run {run_id} is {run.status}; only {', '.join(RESUMABLE_STATUSES)} runs can be resumed")
    launcher = launcher_for(run.target, settings)
    alive = launcher.alive(run)
    if alive is None:
        raise LaunchError(f"run {run_id}: cannot tell now whether its processes on {run.target} have ended "
                          "(unreachable); nothing was changed, try again later")
    if alive:
        raise RunError(f"run {run_id} still has processes running; cancel it before resuming")
    # previous_handle: where the attempt before ran (kept across a resume whose start failed)
    previous = run.handle or run.launch.get("previous_handle") or {}
    launch = {k: v for k, v in run.launch.items() if k != "gpus"}  # placed again by the queue
    checkpoint = launcher.latest_checkpoint(dataclasses.replace(run, handle=previous))
    store.reopen(run_id, {**launch, "resume": True, "previous_handle": previous})
    detail = f"from step {checkpoint[0] + 1} (checkpoint {checkpoint[1]})" if checkpoint else "from step 0 (no checkpoint)"
    if launcher.scheme == "local":
        start_queued_local(store, settings)
        audit.record(store, principal, "resume", run_id, detail)
        return checkpoint
    try:
        claim_and_start(store, store.get_run(run_id), launcher)
    except LaunchError as err:
        store.set_status(run_id, "failed", error=f"resume failed: {err}")
        raise
    audit.record(store, principal, "resume", run_id, detail)
    return checkpoint


def model_outputs(run: Run) -> dict[str, Any]:
    """Where a run's trained policy is (paths on this machine; the run dir of a remote run is the
    launcher's local mirror): ``final`` (the HF directory of a finished run, or None) and
    ``checkpoint`` ((step, path) of the newest checkpoint, or None; a resume continues after it)."""
    from workbench.engine.checkpoint import final_model_dir, latest_checkpoint

    run_dir = Path(run.run_dir)
    return {"final": final_model_dir(run_dir), "checkpoint": latest_checkpoint(run_dir)}


def delete(run_id: str, *, principal: Principal, store: RunRepository | None = None,
           settings: Settings | None = None) -> None:
    """Cancel if still active, then remove the run from the store and its local directory.
    ``principal`` must be allowed to delete this run (its owner, or an admin)."""
    store = store or RunStore()
    run = store.get_run(run_id)
    authorize(principal, "delete", run)
    if run.active:
        cancel(run_id, principal=principal, store=store, settings=settings, grace_s=3.0)
    store.delete(run_id)
    run_dir = Path(run.run_dir)
    runs_root = workbench_home() / RUNS_DIR
    if runs_root in run_dir.resolve().parents:  # never remove anything outside the home's runs/
        shutil.rmtree(run_dir, ignore_errors=True)
    audit.record(store, principal, "delete", run_id,
                 f"{run.name} ({run.status}, by {run.created_by}" + (f", group {run.group})" if run.group else ")"))


def edit_run(run_id: str, *, principal: Principal, name: str | None = None, tags: Iterable[str] | None = None,
             notes: str | None = None, store: RunRepository | None = None) -> Run:
    """Rename a run, replace its tags and / or its notes (None: left as it is); returns the run as
    stored after the edit. Every value is checked before the first is written (a bad tag leaves
    the name unchanged too). ``principal`` must be allowed to edit this run (its owner, or an admin)."""
    store = store or RunStore()
    run = store.get_run(run_id)
    authorize(principal, "edit", run)
    name = check_run_name(name) if name is not None and name != run.name else None
    tags = sorted({check_tag(t) for t in tags}) if tags is not None else None
    changes = {k: v for k, v in (("name", name), ("tags", tags), ("notes", None if notes is None else str(notes)))
               if v is not None}
    if changes:
        store.update_run(run_id, **changes)
        audit.record(store, principal, "edit", run_id,
                     "; ".join(f"{k}: {getattr(run, k)!r} -> {v!r}" for k, v in changes.items()))
    return store.get_run(run_id)


def update_settings(settings: Settings, *, principal: Principal, home: Path | None = None,
                    store: RunRepository | None = None) -> Path:
    """Save the workbench settings (``settings.save_settings``: atomic) as ``principal``, who must
    be an admin: the settings name the hosts runs go to and the modules the app may import. The
    audit entry names the fields that changed (``store``: where it goes; default, the home's store)."""
    authorize(principal, "settings")
    try:
        before: Settings | None = load_settings(home)
    except SettingsError:  # saving is how a broken file gets fixed
        before = None
    path = save_settings(settings, home)
    changed = [name for name in type(settings).model_fields
               if before is None or getattr(before, name) != getattr(settings, name)]
    detail = ("replaced a settings file that did not validate" if before is None
              else f"changed: {', '.join(changed)}" if changed else "saved unchanged")
    audit.record(store or default_store(home), principal, "settings", "settings", detail)
    return path
