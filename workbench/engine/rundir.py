"""Who may write a run directory, and when: claims, the trainer's lock, the recorded recipe.

Every writer of a run directory goes through this module (torch-free, so the run layer and the
CLI use it before anything heavy is imported):

- :func:`prepare` (the run service, before a launcher starts the trainer): a *new* directory, or
  an existing *empty* one, gets the run's ``recipe.yaml``. Anything else is refused and left as it
  was, so a launch can never overwrite another run or a user's folder.
- :func:`claim` (the one entry point of the CLI and the trainer) with ``resume=False``
  (``train RECIPE --run-dir D``): ``D`` must be new, empty, or *prepared* for
  exactly this recipe (only a launcher's files in it, see ``LAUNCHER_FILES``, and a
  ``recipe.yaml`` equal to the recipe being started). The trainer then records ``run.json`` (the
  recipe it starts with and its digest); from then on ``D`` is a started run and only
  ``train --resume D`` continues it.
- :func:`claim` with ``resume=True`` (``train --resume D``): the recipe.yaml must be the one
  recorded in ``run.json`` (a resume runs the recipe it recorded: an edited file is refused, naming
  the first field that differs; both are compared as this version writes them, so a field a later
  version added with a default does not count as an edit), and the checkpoint to load is chosen
  here, verified against its manifest
  (:func:`workbench.engine.checkpoint.choose_resume_checkpoint`), before the directory changes.

A claim that fails before the run's first event (the trainer's set-up raised) is undone with
:meth:`Claim.abandon`: ``D`` is left as it was found, so a corrected rerun is not refused.

One trainer per run directory: the claim takes an exclusive ``flock`` on ``D/.lock`` (the holder's
pid written into it) and keeps it until the run ends; the kernel drops it when the process dies
(kill -9 included), so a crashed run can be resumed at once. A second trainer on a held directory
is refused before it writes anything. Only the main process (``RANK`` 0 or unset) claims and
verifies checkpoints; the other ranks of an ``accelerate launch`` share its claim and receive its
choice of checkpoint (``checkpoint.resume`` broadcasts it).

Refusals raise :class:`RunDirError` (a ``ValueError``: the CLI prints one line ``error: ...`` and
exits 2), an OSError of the file system included (a path under /proc, a read-only mount, a file
system without ``flock``).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

RECIPE_FILE = "recipe.yaml"
RUN_FILE = "run.json"
LOCK_FILE = ".lock"
# What a launcher puts into a run directory before its trainer starts (service: recipe.yaml; local
# reaper: stdout.log, exit_code; SLURM: job.sbatch and the --output log, and with a vLLM node the
# server's log, started before the trainer; SSH: run.sh, pgid).
LAUNCHER_FILES = frozenset({RECIPE_FILE, "stdout.log", "exit_code", "job.sbatch", "vllm_serve.log", "run.sh", "pgid",
                            LOCK_FILE})


class RunDirError(ValueError):
    """A run directory that this command may not write (message says which and why)."""


def recipe_digest(recipe_yaml: str) -> str:
    """sha256 of a recipe's canonical YAML (``Recipe.to_yaml()``): comments and layout of a
    hand-written file do not change it, any field does."""
    return hashlib.sha256(recipe_yaml.encode()).hexdigest()


def is_main_process() -> bool:
    """This process is rank 0 of its launch (``accelerate launch`` / torchrun set ``RANK``)."""
    return os.environ.get("RANK", "0") == "0"


# flock(2) errors of a file system that has no locks (Lustre mounted noflock, some NFS set-ups)
_NO_LOCKS = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP})


def _os_error(run_dir: Path, err: OSError) -> RunDirError:
    """An OSError while claiming ``run_dir`` as one line (a path under /proc, a read-only mount)."""
    return RunDirError(f"run directory {run_dir}: {err.strerror or err}")


@dataclass
class Claim:
    """A run directory claimed by this process: ``resume`` (continue the recorded run) from
    ``checkpoint`` (None: step 0), ``warnings`` to record in the run (e.g. a damaged checkpoint
    skipped). ``release`` ends it; ``abandon`` undoes it (a set-up that failed before the first
    event). ``chosen``: this process verified the checkpoint (the main one; the others receive
    its choice). ``created_dir`` (the topmost folder the claim created, parents included) and the
    ``created_lock`` / ``wrote_*`` flags say what the claim itself put there."""

    run_dir: Path
    recipe_sha256: str
    resume: bool = False
    checkpoint: Path | None = None
    warnings: list[str] = field(default_factory=list)
    lock: IO | None = None
    chosen: bool = False
    created_dir: Path | None = None
    created_lock: bool = False
    wrote_recipe: bool = False
    wrote_run: bool = False

    def release(self) -> None:
        if self.lock is not None:
            self.lock.close()  # closing the descriptor drops the flock
            self.lock = None

    def abandon(self) -> None:
        """Undo the claim: remove what it wrote (run.json, recipe.yaml, the lock file) and the
        directory if it created it, then release the lock; ``run_dir`` is as it was found, so a
        corrected rerun (or the resume it was) is not refused. Call only before the run's first
        event; idempotent."""
        if self.lock is None:
            return
        if self.created_dir is not None:
            shutil.rmtree(self.created_dir, ignore_errors=True)  # nothing of anybody else's was in it
        else:
            for name, wrote in ((RUN_FILE, self.wrote_run), (RECIPE_FILE, self.wrote_recipe),
                                (LOCK_FILE, self.created_lock)):
                if wrote:
                    (self.run_dir / name).unlink(missing_ok=True)
        self.release()


# -- reading (never writes) ----------------------------------------------------------------------
def _entries(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.iterdir())


def _held_by(run_dir: Path) -> str | None:
    """'pid N' when a live process holds ``run_dir``'s lock, else None (opens the lock file read-only)."""
    try:
        with open(run_dir / LOCK_FILE, "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return f"pid {f.read().decode(errors='replace').strip()[:20] or '?'}"
    except OSError:
        return None
    return None


def _why_not_new(run_dir: Path, recipe_yaml: str, locked: bool = False) -> str | None:
    """Why a new run may not be written into ``run_dir`` (None: it may): it must be absent, empty,
    or prepared by a launcher for exactly this recipe."""
    if not run_dir.exists():
        return None
    if not run_dir.is_dir():
        return "it exists and is not a directory"
    names = [n for n in _entries(run_dir) if n != LOCK_FILE]  # a lock alone: a claim under way (the lock decides)
    if not names:
        return None
    if RECIPE_FILE in names and set(names) <= LAUNCHER_FILES:
        try:
            same = (run_dir / RECIPE_FILE).read_text() == recipe_yaml
        except (OSError, UnicodeDecodeError):
            same = False
        if same:
            return None  # prepared by a launcher for this very recipe
    holder = None if locked else _held_by(run_dir)
    shown = ", ".join(names[:4]) + (f", ... ({len(names)} entries)" if len(names) > 4 else "")
    what = (f"a live trainer ({holder}) is writing it" if holder else
            "it holds a run (run.json)" if RUN_FILE in names else f"it is not empty ({shown})")
    return what


def recorded_recipe(run_dir: Path) -> dict[str, Any] | None:
    """``run.json`` of a started run (None: a run started before run.json existed, or none)."""
    try:
        data = json.loads((Path(run_dir) / RUN_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise RunDirError(f"{run_dir}/{RUN_FILE} cannot be read ({err}); the run's recorded recipe is unknown") from None
    if not isinstance(data, dict) or not isinstance(data.get("recipe_sha256"), str):
        raise RunDirError(f"{run_dir}/{RUN_FILE} has no recipe_sha256; the run's recorded recipe is unknown")
    return data


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: value}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def first_difference(recorded_yaml: str, current_yaml: str) -> str:
    """'field optim.lr 0.001 -> 0.5' for the first field (in recipe order) that differs."""
    import yaml  # both texts are canonical Recipe.to_yaml() output: plain mappings

    try:
        old, new = _flat(yaml.safe_load(recorded_yaml) or {}), _flat(yaml.safe_load(current_yaml) or {})
    except yaml.YAMLError:
        return "its content"
    for key in [*new, *(k for k in old if k not in new)]:
        if old.get(key, "<absent>") != new.get(key, "<absent>"):
            return f"field {key} {_short(old.get(key, '<absent>'))} -> {_short(new.get(key, '<absent>'))}"
    return "its content"


# -- writing ----------------------------------------------------------------------------------------
def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _make_fresh_dir(run_dir: Path) -> bool:
    """Create ``run_dir`` (True) or accept it as an existing empty directory (False); else refuse."""
    try:
        run_dir.mkdir(parents=True)
        return True
    except FileExistsError:
        if run_dir.is_dir() and not any(run_dir.iterdir()):
            return False
        raise RunDirError(f"run directory {run_dir} exists and is not empty; a new run is written only into a "
                          "new or empty directory") from None


def prepare(run_dir: Path, recipe_yaml: str) -> bool:
    """A launcher's run directory: new (or existing and empty) with ``recipe.yaml``; on failure
    whatever this call created is removed and nothing else is touched. Returns whether this call
    created the directory (decided by the mkdir itself, so the caller's clean-up never races
    another process: False means it was there, empty, and only ``recipe.yaml`` is ours)."""
    run_dir = Path(run_dir)
    created = _make_fresh_dir(run_dir)
    try:
        _write_atomically(run_dir / RECIPE_FILE, recipe_yaml)
    except BaseException:
        (run_dir / RECIPE_FILE).unlink(missing_ok=True)
        if created:
            run_dir.rmdir()
        raise
    return created


def _lock(run_dir: Path) -> tuple[IO, bool]:
    """An exclusive flock on ``run_dir/.lock`` held through the returned file (pid written in it),
    and whether this call created the lock file. OSErrors become one-line RunDirErrors."""
    path = run_dir / LOCK_FILE
    try:
        created = not path.exists()
        f = open(path, "a+b")
    except OSError as err:
        raise _os_error(run_dir, err) from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        f.truncate(0)
        f.write(str(os.getpid()).encode())
        f.flush()
    except OSError as err:
        f.seek(0)
        holder = f.read().decode(errors="replace").strip()[:20] or "?"
        f.close()
        if created:
            path.unlink(missing_ok=True)
        if err.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise RunDirError(f"run directory {run_dir} is in use by a live trainer (pid {holder}); one trainer "
                              "per run directory: wait for it to end or cancel it") from None
        if err.errno in _NO_LOCKS:
            raise RunDirError(f"run directory {run_dir} is on a file system without file locks (flock: "
                              f"{err.strerror}); one trainer per run directory needs them: use a local disk or "
                              "a mount with locks (Lustre: -o flock)") from None
        raise _os_error(run_dir, err) from None
    return f, created


def _topmost_missing(path: Path) -> Path | None:
    """The topmost folder of ``path`` (itself or a parent) that does not exist yet: what
    ``mkdir(parents=True)`` would create first."""
    top = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        top = folder
    return top


def _claim_new(run_dir: Path, recipe_yaml: str, main: bool) -> Claim:
    """Claim ``run_dir`` for a new run of ``recipe_yaml`` (canonical YAML): checked before anything
    is written, created if absent, locked, checked again under the lock (another trainer may have
    claimed it meanwhile), then ``recipe.yaml`` and ``run.json`` are recorded."""
    digest = recipe_digest(recipe_yaml)
    if not main:
        return Claim(run_dir, digest)
    why = _why_not_new(run_dir, recipe_yaml)
    if why is not None:
        raise RunDirError(f"--run-dir {run_dir}: {why}; a new run is written only into a new or empty directory "
                          "(continue a run with `train --resume DIR`)")
    created = _topmost_missing(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _os_error(run_dir, err) from None
    claim = Claim(run_dir, digest, created_dir=created)
    try:
        claim.lock, claim.created_lock = _lock(run_dir)
        why = _why_not_new(run_dir, recipe_yaml, locked=True)
        if why is not None:
            claim.created_dir = None  # another claim got there first: nothing here is ours but the lock file
            raise RunDirError(f"--run-dir {run_dir}: {why}; a new run is written only into a new or empty directory")
        if not (run_dir / RECIPE_FILE).is_file():
            claim.wrote_recipe = True
            _write_atomically(run_dir / RECIPE_FILE, recipe_yaml)
        claim.wrote_run = True
        _write_atomically(run_dir / RUN_FILE, json.dumps(
            {"recipe_sha256": digest, "recipe": recipe_yaml, "started_at": time.time(), "pid": os.getpid()}))
    except BaseException as err:
        if claim.lock is not None:
            claim.abandon()
        elif created is not None:  # not locked: another trainer may be in it now; only empty folders go
            for folder in (run_dir, *run_dir.parents):
                try:
                    folder.rmdir()
                except OSError:
                    break
                if folder == created:
                    break
        if isinstance(err, OSError):
            raise _os_error(run_dir, err) from None
        raise
    return claim


def _canonical(recipe_yaml: str) -> str:
    """``recipe_yaml`` as this version writes it (``Recipe.to_yaml()``): a field added later with a
    default appears with that default, so a recipe recorded by an older version compares equal."""
    from workbench.recipe import Recipe, RecipeError

    try:
        return Recipe.from_yaml(recipe_yaml).to_yaml()
    except (RecipeError, ValueError):
        return recipe_yaml  # no longer a valid recipe: compared as written (it differs)


def check_recorded_recipe(run_dir: Path, recipe_yaml: str) -> str:
    """The digest of the run's recorded recipe (the one its checkpoints' manifests carry); refuses a
    ``recipe.yaml`` that differs from the one the run started with. Both are compared as this
    version writes them (a default added by a later version is no edit). A run from before
    ``run.json`` existed has nothing recorded: its file is taken."""
    recorded = recorded_recipe(run_dir)
    digest = recipe_digest(recipe_yaml)
    if recorded is None or recorded["recipe_sha256"] == digest:
        return digest
    then = _canonical(str(recorded.get("recipe", "")))
    if then != recipe_yaml:
        raise RunDirError(f"{run_dir}/{RECIPE_FILE} was edited after the run started: "
                          f"{first_difference(then, recipe_yaml)}; a resume runs the recorded recipe "
                          "(start a new run for a changed recipe)")
    return recorded["recipe_sha256"]


def _claim_resume(run_dir: Path, recipe_yaml: str, steps: int, main: bool) -> Claim:
    """Claim ``run_dir`` to continue its run: locked, its recipe unchanged, and the intact
    checkpoint to load chosen (see ``choose_resume_checkpoint``; with ``run.json`` every
    checkpoint must have its manifest); nothing is written but the lock file. The other ranks
    check nothing: the main process's choice reaches them (``checkpoint.resume``)."""
    from workbench.engine.checkpoint import CheckpointError, choose_resume_checkpoint

    if not main:
        return Claim(run_dir, recipe_digest(recipe_yaml), resume=True)
    lock, created_lock = _lock(run_dir)
    claim = Claim(run_dir, recipe_digest(recipe_yaml), resume=True, lock=lock, created_lock=created_lock,
                  chosen=True)
    try:
        claim.recipe_sha256 = check_recorded_recipe(run_dir, recipe_yaml)
        try:
            claim.checkpoint, claim.warnings = choose_resume_checkpoint(
                run_dir, steps, claim.recipe_sha256, require_manifest=recorded_recipe(run_dir) is not None)
        except CheckpointError as err:
            raise RunDirError(str(err)) from None
        except OSError as err:
            raise _os_error(run_dir, err) from None
    except BaseException:
        claim.abandon()
        raise
    return claim


def claim(run_dir: Path, recipe_yaml: str, steps: int, *, resume: bool, main: bool | None = None) -> Claim:
    """Claim ``run_dir`` for a new run of ``recipe_yaml`` (canonical ``Recipe.to_yaml()``) or, with
    ``resume``, to continue the run recorded there for ``steps`` steps: the one entry point of the
    CLI and the trainer. ``main``: this is the launch's main process (default: ``RANK``)."""
    main = is_main_process() if main is None else main
    if resume:
        return _claim_resume(Path(run_dir), recipe_yaml, steps, main)
    return _claim_new(Path(run_dir), recipe_yaml, main)
