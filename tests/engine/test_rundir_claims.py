"""Every writer of run directories writes a new run only into a new or empty directory
(workbench/engine/rundir.py): the class of writers x the class of occupied directories, checked
byte for byte. Torch-free and fast; the training side is in test_rundir_train.py."""

import subprocess
import sys
from pathlib import Path

import pytest

from workbench.engine import rundir
from workbench.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
GRPO = load_recipe("grpo").to_yaml()
RLOO = load_recipe("rloo").to_yaml()


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root`` with its bytes (None for a folder): what 'untouched' means."""
    if not root.exists():
        return {}
    return {p.relative_to(root).as_posix(): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


# -- the occupied directories: each must be refused, byte for byte untouched -------------------------
def started_run(d: Path) -> None:
    """A run the trainer claimed: recipe.yaml, run.json, events, a checkpoint, final/."""
    d.mkdir(parents=True)
    (d / "recipe.yaml").write_text(GRPO)
    (d / "run.json").write_text(f'{{"recipe_sha256": "{rundir.recipe_digest(GRPO)}", "recipe": ""}}')
    (d / "events.jsonl").write_text('{"kind": "status", "step": 0, "time": 1, "status": "starting"}\n')
    (d / "checkpoints" / "step-00000004").mkdir(parents=True)
    (d / "checkpoints" / "step-00000004" / "trainer_state.json").write_text('{"step": 4}')
    (d / "final").mkdir()
    (d / "final" / "config.json").write_text("{}")


def unrelated_folder(d: Path) -> None:
    """Somebody's folder: a file and a subfolder with a file."""
    (d / "notes").mkdir(parents=True)
    (d / "thesis.tex").write_text("\\section{Results}")
    (d / "notes" / "todo.txt").write_text("buy milk")


def prepared_for_another_recipe(d: Path) -> None:
    """A launcher's directory prepared for rloo: not the grpo run being started."""
    d.mkdir(parents=True)
    (d / "recipe.yaml").write_text(RLOO)
    (d / "stdout.log").write_text("")


def a_file(d: Path) -> None:
    d.parent.mkdir(parents=True, exist_ok=True)
    d.write_text("not a directory")


OCCUPIED = [started_run, unrelated_folder, prepared_for_another_recipe, a_file]


# -- the writers ------------------------------------------------------------------------------------
def write_by_trainer_claim(d: Path, tmp_path: Path) -> None:
    """Trainer.__init__ / `train --run-dir` (the CLI claims before torch is imported)."""
    rundir.claim_new(d, GRPO, main=True).release()


def write_by_service_prepare(d: Path, tmp_path: Path) -> None:
    """runs/service.launch: the directory a launcher starts the trainer in."""
    rundir.prepare(d, GRPO)


def write_by_cli_train(d: Path, tmp_path: Path) -> None:
    """`python -m workbench train grpo --run-dir D` as a user types it."""
    out = subprocess.run([sys.executable, "-m", "workbench", "train", "grpo", "--run-dir", str(d)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        assert out.returncode == 2 and out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
        raise rundir.RunDirError(out.stderr)


def write_by_exported_bash_script(d: Path, tmp_path: Path, python: str = sys.executable) -> None:
    """`export --to bash` with a fixed run directory, run as exported (its trainer included)."""
    from workbench.export.scripts import BashOptions, bash_script

    script = tmp_path / "run.sh"
    script.write_text(bash_script(load_recipe("grpo"), BashOptions(run_dir=str(d), python=python)))
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        # the script's own refusal, or its trainer's (accelerate launch adds its traceback after it)
        assert "error: run directory" in out.stderr or "error: --run-dir" in out.stderr, out.stderr
        raise rundir.RunDirError(out.stderr)


def write_by_exported_bash_script_up_to_its_trainer(d: Path, tmp_path: Path) -> None:
    """The same script with a stand-in interpreter (what the script itself writes)."""
    write_by_exported_bash_script(d, tmp_path, python="true")


WRITERS = [write_by_trainer_claim, write_by_service_prepare, write_by_cli_train, write_by_exported_bash_script]


@pytest.mark.parametrize("occupy", OCCUPIED, ids=lambda f: f.__name__)
@pytest.mark.parametrize("writer", WRITERS, ids=lambda f: f.__name__)
def test_no_writer_touches_an_occupied_directory(writer, occupy, tmp_path, fresh_home):
    d = tmp_path / "D"
    occupy(d)
    before = {**snapshot(tmp_path), "D": d.read_bytes() if d.is_file() else None}
    with pytest.raises(rundir.RunDirError):
        writer(d, tmp_path)
    after = {**snapshot(tmp_path), "D": d.read_bytes() if d.is_file() else None}
    after.pop("run.sh", None), before.pop("run.sh", None)
    assert after == before


@pytest.mark.parametrize("writer", [write_by_trainer_claim, write_by_service_prepare,
                                    write_by_exported_bash_script_up_to_its_trainer],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("state", ["absent", "empty"])
def test_every_writer_takes_a_new_or_empty_directory(writer, state, tmp_path, fresh_home):
    d = tmp_path / "deep" / "D"
    if state == "empty":
        d.mkdir(parents=True)
    writer(d, tmp_path)
    assert (d / "recipe.yaml").read_text() == GRPO


def test_the_trainer_takes_the_directory_a_launcher_prepared_for_its_recipe_once(tmp_path):
    d = tmp_path / "D"
    rundir.prepare(d, GRPO)
    (d / "stdout.log").write_text("reaper output\n")
    claim = rundir.claim_new(d, GRPO, main=True)
    assert rundir.recorded_recipe(d)["recipe_sha256"] == rundir.recipe_digest(GRPO) == claim.recipe_sha256
    claim.release()
    with pytest.raises(rundir.RunDirError, match="holds a run"):  # started now: only --resume continues it
        rundir.claim_new(d, GRPO, main=True)


def test_other_ranks_write_nothing(tmp_path):
    claim = rundir.claim_new(tmp_path / "D", GRPO, main=False)
    assert claim.lock is None and not (tmp_path / "D").exists()


def test_a_held_directory_is_refused_with_the_holders_pid_until_it_is_released(tmp_path):
    """The lock is an OS lock: a second process is refused while the first lives, and may take it
    once the first has released it (or died: the kernel drops a dead process's flock)."""
    d = tmp_path / "D"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from workbench.engine import rundir; "
        f"c = rundir.claim_new({str(d)!r}, {GRPO!r}, main=True); print('held', flush=True); time.sleep(60)")],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(rundir.RunDirError, match=f"in use by a live trainer \\(pid {holder.pid}\\)"):
            rundir.claim_resume(d, GRPO, 10, main=True)
        with pytest.raises(rundir.RunDirError, match=f"a live trainer \\(pid {holder.pid}\\) is writing it"):
            rundir.claim_new(d, GRPO, main=True)
    finally:
        holder.kill()
        holder.wait()
    rundir.claim_resume(d, GRPO, 10, main=True).release()


def test_a_resume_refuses_an_edited_recipe_naming_the_field(tmp_path):
    d = tmp_path / "D"
    rundir.claim_new(d, GRPO, main=True).release()
    edited = load_recipe("grpo", ["optim.lr=0.5"]).to_yaml()
    with pytest.raises(rundir.RunDirError, match=r"recipe.yaml was edited after the run started: field optim.lr "
                                                 r"0.001 -> 0.5; a resume runs the recorded recipe"):
        rundir.claim_resume(d, edited, 10, main=True)
    with pytest.raises(rundir.RunDirError, match="field algorithm.advantage 'grpo' -> 'rloo'"):
        rundir.claim_resume(d, load_recipe("grpo", ["algorithm.advantage=rloo"]).to_yaml(), 10, main=True)


def test_the_service_refuses_an_occupied_run_directory_and_leaves_no_row(fresh_home, monkeypatch):
    """A run id whose directory already exists (e.g. restored from a backup): the launch is refused,
    the directory untouched (the old code removed it on the way out) and no row left."""
    from workbench.runs import RunError, RunStore
    from workbench.runs import service

    existing = fresh_home / "runs" / "taken-id"
    unrelated_folder(existing)
    before = snapshot(existing)
    monkeypatch.setattr(service, "new_run_id", lambda name: "taken-id")
    store = RunStore()
    with pytest.raises(RunError, match="not empty"):
        service.launch(load_recipe("grpo"), store=store)
    assert snapshot(existing) == before
    assert store.runs() == []
