"""Run directories copied to another workbench home: ``db copy --runs-to DIR`` (``workbench.runs.dbtools``).

A copied row's ``run_dir`` names the old machine's folder; with ``--runs-to DIR`` each run's
directory (logs, events, checkpoints, recipe) is COPIED to ``DIR/runs/RUN_ID`` (the layout of
``workbench.runs.lifecycle.RUNS_DIR``) and the copied rows point there. The source's rows and
folders are only read. Around the row copy's one transaction, so the user sees all or nothing:

1. ``check_runs_home`` and ``plan_run_dirs`` (read only): refusals, one line each (``RunError``),
   before anything is written: ``DIR`` not a folder this user can make or write; a run still
   active (its directory is still being written); a run whose directory is not on this machine;
   a target folder that already exists; a link that leads out of its run directory, or a FIFO,
   socket or device inside one.
2. ``stage_run_dirs``: every directory copied into ``DIR/runs/.db-copy-XXXX/RUN_ID`` (beside the
   final place, so the later rename cannot cross a file system); ``remove_staged`` undoes it, and
   the folders it made, when the row copy fails.
3. ``rewrite_run_row`` (inside the row copy): ``run_dir``, every path inside the old directory in
   the ``launch`` and ``handle`` JSON (SLURM's ``script``, Ray's ``run_dir``, a resume's
   ``previous_handle``), and ``events_inode`` (the copied ``events.jsonl``'s identity).
4. ``place_run_dirs`` (after the commit): each staged folder renamed to ``DIR/runs/RUN_ID``;
   ``PlacementError`` says what is where if one cannot be.

Not rewritten: text that merely mentions a path (a local run's ``handle.command``, the command
line that ran on the old machine; ``error``, ``warnings``, audit details): records of what
happened there, not paths anything opens.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from workbench.home import confined_path
from workbench.runs.launchers.base import EVENTS_FILE, file_identity
from workbench.runs.lifecycle import RUNS_DIR
from workbench.runs.records import ACTIVE_STATUSES, TERMINAL_STATUSES, RunError

STAGE_PREFIX = ".db-copy-"  # DIR/runs/.db-copy-XXXX: hidden, and beside the folders it becomes
PATH_JSON_COLUMNS = ("launch", "handle")  # runs columns whose JSON may hold paths inside the run directory
HOW_TO_SKIP = "or copy without --runs-to (the rows keep the old paths)"


class PlacementError(RunError):
    """The rows were committed but a staged run directory could not be renamed into place."""


@dataclass(frozen=True)
class RunDirMove:
    """One run's directory: where the source has it (``old``, the stored string) and where it goes."""

    run_id: str
    old: str
    new: Path


@dataclass(frozen=True)
class RunDirPlan:
    """Every run of the source, checked: ``home`` the target workbench home (absolute)."""

    home: Path
    moves: dict[str, RunDirMove]

    @property
    def runs_root(self) -> Path:
        return self.home / RUNS_DIR


@dataclass
class Staged:
    """The plan's directories copied into ``folder`` (None until made); ``made`` the folders
    (``DIR``, ``DIR/runs``) this copy created; ``identities`` run id -> the copied events file's
    ``dev:ino``; ``bytes`` copied; ``seen`` run ids whose rows were copied."""

    plan: RunDirPlan
    made: list[Path]
    folder: Path | None = None
    identities: dict[str, str] = field(default_factory=dict)
    bytes: int = 0
    seen: set[str] = field(default_factory=set)


# -- 1. refusals, before anything is written -------------------------------------------------------

def check_runs_home(value: str | os.PathLike) -> Path:
    """``value`` as an absolute workbench home whose ``runs/`` this user can make or write; RunError
    naming ``--runs-to`` otherwise. Reads only: nothing is made here."""
    if not str(value).strip():
        raise RunError("--runs-to='' is not allowed; a workbench home: a folder this user can write (made if missing)")
    home = Path(os.path.abspath(Path(value).expanduser())).resolve()
    runs_root = home / RUNS_DIR
    reason = _unwritable(runs_root)
    if reason:
        raise RunError(f"--runs-to={str(value)!r} is not allowed: {reason}; a workbench home is allowed: a folder "
                       "this user can write (made if missing), whose runs/ receives the copied run directories")
    return home


def _unwritable(folder: Path) -> str | None:
    """Why ``folder`` cannot be made or written (None: it can): the first of it and its parents
    that exists must be a folder this user may add entries to."""
    for path in (folder, *folder.parents):
        if os.path.lexists(path):
            if not path.is_dir():
                return f"{str(path)!r} is not a directory"
            if not os.access(path, os.W_OK | os.X_OK):
                return f"{str(path)!r} cannot be written by this user"
            return None
    return None  # not reached: / exists


def plan_run_dirs(runs: Iterable[Mapping[str, Any]], home: Path) -> RunDirPlan:
    """Each run (``id``, ``status``, ``run_dir`` of the source's rows) checked for a copy into
    ``home`` (from ``check_runs_home``); RunError naming the first run refused. Reads only."""
    moves: dict[str, RunDirMove] = {}
    for run in runs:
        move = RunDirMove(run["id"], run["run_dir"], _new_dir(run["id"], home))
        for check in RUN_CHECKS:  # cheap checks of every kind first; the walk of the folder last
            refusal = check(run, move)
            if refusal:
                raise RunError(refusal)
        moves[move.run_id] = move
    return RunDirPlan(home, moves)


def _new_dir(run_id: str, home: Path) -> Path:
    """``home/runs/RUN_ID`` as lifecycle makes a run directory (``confined_path``: resolved, inside)."""
    try:
        new = confined_path(Path(RUNS_DIR) / run_id, root=home, field="runs.id")
    except ValueError as err:
        raise RunError(f"{err} (with --runs-to a run id names a folder under {home / RUNS_DIR})") from None
    if new.parent != (home / RUNS_DIR).resolve():  # "a/b" stays inside, but is not a folder of runs/
        raise RunError(f"runs.id={run_id!r} is not allowed with --runs-to: a run id names one folder under "
                       f"{home / RUNS_DIR}; {HOW_TO_SKIP}")
    return new


def _still_active(run: Mapping[str, Any], move: RunDirMove) -> str | None:
    if run["status"] in ACTIVE_STATUSES:
        return (f"runs.status={run['status']!r} of run {move.run_id!r} is not allowed with --runs-to: its directory "
                f"is still being written; allowed: {', '.join(TERMINAL_STATUSES)}; wait for it to end or cancel it, "
                f"then copy again; {HOW_TO_SKIP}")
    return None


def _missing_here(run: Mapping[str, Any], move: RunDirMove) -> str | None:
    if not Path(move.old).is_dir():
        return (f"runs.run_dir={move.old!r} of run {move.run_id!r} is not a directory on this machine; --runs-to "
                "copies run directories that are here: copy on the machine (or mount) that has them, "
                f"{HOW_TO_SKIP}")
    return None


def _target_taken(run: Mapping[str, Any], move: RunDirMove) -> str | None:
    if os.path.lexists(move.new):
        return (f"--runs-to: {str(move.new)!r} (run {move.run_id!r}) already exists; a copy never overwrites a run "
                f"directory: give another workbench home, or move that folder away first; {HOW_TO_SKIP}")
    return None


def _uncopyable_entry(run: Mapping[str, Any], move: RunDirMove) -> str | None:
    """The first entry of the run's folder that is neither a file, a folder, nor a link that stays
    inside it."""
    root = Path(move.old)
    try:
        for path in _entries(root):
            refusal = _refusal_of_entry(move.run_id, root, path)
            if refusal:
                return refusal
    except OSError as err:
        return (f"run {move.run_id!r}: its directory {move.old!r} cannot be read: {err.strerror or err} "
                f"({err.filename}); make it readable, {HOW_TO_SKIP}")
    return None


RUN_CHECKS: tuple[Callable[[Mapping[str, Any], RunDirMove], str | None], ...] = (
    _still_active, _missing_here, _target_taken, _uncopyable_entry)


def _entries(root: Path) -> Iterable[Path]:
    """Every entry under ``root``; links to folders are listed, not entered; an unreadable folder
    raises (``os.walk`` would skip it silently)."""
    def fail(err: OSError) -> None:
        raise err

    for folder, dirs, files in os.walk(root, onerror=fail):
        yield from (Path(folder) / name for name in (*dirs, *files))


def _refusal_of_entry(run_id: str, root: Path, path: Path) -> str | None:
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode):
        return _link_refusal(run_id, root, path)
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return (f"run {run_id!r}: {str(path)!r} is not a file, folder or link (a FIFO, socket or device), which a copy "
            f"cannot hold; remove it, then copy again; {HOW_TO_SKIP}")


def _link_refusal(run_id: str, root: Path, link: Path) -> str | None:
    """A link is copied as a link, and only when it is relative and leads inside the run directory
    (lexically and as resolved): then it means the same in the copy. Any other is refused: copied,
    the new folder would read from a path outside its workbench home (another machine's, or
    anything); followed, the copy would take in whatever it names (a data set, /)."""
    target = os.readlink(link)
    base = os.path.realpath(root)
    lexical = os.path.normpath(os.path.join(link.parent, target))
    inside = (not os.path.isabs(target) and _within(lexical, os.path.normpath(root))
              and _within(os.path.realpath(link), base))
    if inside:
        return None
    return (f"run {run_id!r}: link {str(link)!r} -> {target!r} leads outside its run directory; --runs-to copies "
            "only relative links that stay inside it: replace the link by what it points to, or remove it, then "
            f"copy again; {HOW_TO_SKIP}")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


# -- 2. staged copies, undone when the rows are not committed ---------------------------------------

def stage_run_dirs(plan: RunDirPlan) -> Staged:
    """Copy every planned directory into a new hidden folder of ``DIR/runs``; on any failure what
    this made is removed again and RunError names the run, or ``--runs-to`` when its folders
    cannot be made (a name too long, a file system that refuses: what the read-only checks of
    ``check_runs_home`` cannot see)."""
    staged = Staged(plan, [])
    try:
        _make_dirs(plan.runs_root, staged.made)
        staged.folder = Path(tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=plan.runs_root))
        for move in plan.moves.values():
            _stage_one(staged, move)  # its own OSErrors are RunErrors naming the run
    except OSError as err:
        remove_staged(staged)
        raise RunError(f"--runs-to={str(plan.home)!r} is not allowed: {str(plan.runs_root)!r} cannot be made or "
                       f"written there: {err.strerror or err}; a workbench home is allowed: a folder this user can "
                       "write (made if missing), whose runs/ receives the copied run directories") from None
    except BaseException:
        remove_staged(staged)
        raise
    return staged


def _stage_one(staged: Staged, move: RunDirMove) -> None:
    """``move.old`` copied (contents, times, modes; links as links) to the staging folder."""
    dest = staged.folder / move.run_id

    def counted_copy(src: str, dst: str) -> str:
        done = shutil.copy2(src, dst)
        staged.bytes += os.path.getsize(dst)
        return done

    try:
        shutil.copytree(move.old, dest, symlinks=True, copy_function=counted_copy)
    except (OSError, shutil.Error) as err:
        reason = " ".join(str(err).split())
        raise RunError(f"run {move.run_id!r}: its directory {move.old!r} cannot be copied to {str(dest)!r}: "
                       f"{reason}; nothing was copied") from err
    events = dest / EVENTS_FILE
    if events.is_file():  # a rename keeps dev:ino, so this is the identity the placed file will have
        staged.identities[move.run_id] = file_identity(events.stat())


def _make_dirs(folder: Path, made: list[Path]) -> None:
    """Make ``folder`` and its missing parents, outermost first, each appended to ``made`` as it is
    made (so that a failure half-way leaves a list of what to remove)."""
    for path in reversed((folder, *folder.parents)):
        if not os.path.isdir(path):  # False, not an error, for a name too long: then mkdir says why
            path.mkdir()
            made.append(path)


def remove_staged(staged: Staged) -> None:
    """Remove the staging folder and the folders this copy made (if still empty)."""
    if staged.folder is not None:
        shutil.rmtree(staged.folder, ignore_errors=True)
    for folder in reversed(staged.made):
        try:
            folder.rmdir()
        except OSError:  # something else was put there meanwhile: not ours to remove
            pass


# -- 3. the copied rows pointed at the new folders ---------------------------------------------------

def rewrite_run_row(staged: Staged, row: dict[str, Any]) -> dict[str, Any]:
    """The source's ``runs`` row as the target gets it: every path into the old directory moved to
    the new one. RunError when the row is not the one planned (the source changed meanwhile)."""
    move = staged.plan.moves.get(row["id"])
    if move is None or move.old != row["run_dir"] or row["status"] in ACTIVE_STATUSES:
        raise RunError(f"run {row['id']!r} changed in the source during the copy (added, moved or started); "
                       "nothing was copied: run the copy again")
    staged.seen.add(move.run_id)
    new = str(move.new)
    rewritten = {**row, "run_dir": new, **{c: _moved_json(row[c], move.old, new) for c in PATH_JSON_COLUMNS}}
    identity = staged.identities.get(move.run_id)
    if row["events_inode"] is not None and identity is not None:
        # the collector compares it with the file it reads: the old machine's would read as a
        # replaced file, re-read from the start with a warning, on a resume
        rewritten["events_inode"] = identity
    return rewritten


def check_all_copied(staged: Staged) -> None:
    """RunError when a planned run's row was not in the copy (deleted from the source meanwhile):
    its staged folder would have no row."""
    gone = sorted(set(staged.plan.moves) - staged.seen)
    if gone:
        raise RunError(f"run {gone[0]!r} was deleted from the source during the copy; nothing was copied: "
                       "run the copy again")


def _moved_json(text: str | None, old: str, new: str) -> str | None:
    """JSON text with every string that is ``old`` or a path inside it moved under ``new``; the
    text itself when nothing changes (kept byte for byte)."""
    if text is None:
        return None
    value = json.loads(text)
    moved = _moved(value, old, new)
    return text if moved == value else json.dumps(moved)


def _moved(value: Any, old: str, new: str) -> Any:
    if isinstance(value, dict):
        return {k: _moved(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_moved(v, old, new) for v in value]
    if isinstance(value, str) and _within(value, old):
        return new + value[len(old):]
    return value


# -- 4. after the commit ----------------------------------------------------------------------------

def place_run_dirs(staged: Staged) -> None:
    """Rename each staged folder to ``DIR/runs/RUN_ID``; PlacementError saying what is where if
    one cannot be (the rows are committed and already point there)."""
    placed = 0
    for move in staged.plan.moves.values():
        source = staged.folder / move.run_id
        try:
            # checked again: rename(2) silently replaces an EMPTY folder made since the plan
            if os.path.lexists(move.new):
                raise FileExistsError(f"{move.new} appeared during the copy")
            os.rename(source, move.new)
        except OSError as err:
            root, left = str(staged.plan.runs_root), len(staged.plan.moves) - placed
            raise PlacementError(
                f"the rows were copied (committed) and point into {root!r}, but run {move.run_id!r}'s directory could "
                f"not be renamed from {str(source)!r} to {str(move.new)!r}: {err.strerror or err}; {placed} of "
                f"{len(staged.plan.moves)} run directories are in place, the other {left} are in "
                f"{str(staged.folder)!r} (one folder per run id): move them into {root!r} by hand, then remove that "
                "empty folder") from err
        placed += 1
    try:
        staged.folder.rmdir()
    except OSError:  # not empty: something else was put there; every run is in place, so leave it
        pass
