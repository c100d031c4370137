"""Every writer of run directories writes a new run only into a new or empty directory
(workbench/engine/rundir.py): the class of writers x the class of occupied directories, checked
byte for byte. Torch-free and fast; the training side is in test_rundir_train.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.engine import rundir
from workbench.recipe import load_recipe
from workbench.runs.authz import local_principal

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


def launcher_lookalikes(d: Path) -> None:
    """Files whose names match a launcher's file names read as regular expressions (".lock",
    "stdout.log"), but are somebody else's."""
    d.mkdir(parents=True)
    (d / "xlock").write_text("mine")
    (d / "stdout_log").write_text("mine too")


OCCUPIED = [started_run, unrelated_folder, prepared_for_another_recipe, a_file, launcher_lookalikes]


# -- the writers ------------------------------------------------------------------------------------
def write_by_trainer_claim(d: Path, tmp_path: Path) -> None:
    """Trainer.__init__ / `train --run-dir` (the CLI claims before torch is imported)."""
    rundir.claim(d, GRPO, 10, resume=False, main=True).release()


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
    claim = rundir.claim(d, GRPO, 10, resume=False, main=True)
    assert rundir.recorded_recipe(d)["recipe_sha256"] == rundir.recipe_digest(GRPO) == claim.recipe_sha256
    claim.release()
    with pytest.raises(rundir.RunDirError, match="holds a run"):  # started now: only --resume continues it
        rundir.claim(d, GRPO, 10, resume=False, main=True)


def test_other_ranks_write_nothing(tmp_path):
    claim = rundir.claim(tmp_path / "D", GRPO, 10, resume=False, main=False)
    assert claim.lock is None and not (tmp_path / "D").exists()


def test_a_held_directory_is_refused_with_the_holders_pid_until_it_is_released(tmp_path):
    """The lock is an OS lock: a second process is refused while the first lives, and may take it
    once the first has released it (or died: the kernel drops a dead process's flock)."""
    d = tmp_path / "D"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from workbench.engine import rundir; "
        f"c = rundir.claim({str(d)!r}, {GRPO!r}, 10, resume=False, main=True); print('held', flush=True); time.sleep(60)")],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(rundir.RunDirError, match=f"in use by a live trainer \\(pid {holder.pid}\\)"):
            rundir.claim(d, GRPO, 10, resume=True, main=True)
        with pytest.raises(rundir.RunDirError, match=f"a live trainer \\(pid {holder.pid}\\) is writing it"):
            rundir.claim(d, GRPO, 10, resume=False, main=True)
    finally:
        holder.kill()
        holder.wait()
    rundir.claim(d, GRPO, 10, resume=True, main=True).release()


def test_a_resume_refuses_an_edited_recipe_naming_the_field(tmp_path):
    d = tmp_path / "D"
    rundir.claim(d, GRPO, 10, resume=False, main=True).release()
    edited = load_recipe("grpo", ["optim.lr=0.5"]).to_yaml()
    with pytest.raises(rundir.RunDirError, match=r"recipe.yaml was edited after the run started: field optim.lr "
                                                 r"0.001 -> 0.5; a resume runs the recorded recipe"):
        rundir.claim(d, edited, 10, resume=True, main=True)
    with pytest.raises(rundir.RunDirError, match="field algorithm.advantage 'grpo' -> 'rloo'"):
        rundir.claim(d, load_recipe("grpo", ["algorithm.advantage=rloo"]).to_yaml(), 10, resume=True, main=True)


def test_the_service_refuses_an_occupied_run_directory_and_leaves_no_row(fresh_home, monkeypatch):
    """A run id whose directory already exists (e.g. restored from a backup): the launch is refused,
    the directory untouched (the old code removed it on the way out) and no row left."""
    from workbench.runs import RunError, RunStore
    from workbench.runs import lifecycle as service  # where launch names its runs

    existing = fresh_home / "runs" / "taken-id"
    unrelated_folder(existing)
    before = snapshot(existing)
    monkeypatch.setattr(service, "new_run_id", lambda name: "taken-id")
    store = RunStore()
    with pytest.raises(RunError, match="not empty"):
        service.launch(load_recipe("grpo"), principal=local_principal(), store=store)
    assert snapshot(existing) == before
    assert store.runs() == []


# -- a claim undone, an older version's recipe, file system errors ------------------------------------
def prepared_for_this_recipe(d: Path) -> None:
    rundir.prepare(d, GRPO)
    (d / "stdout.log").write_text("reaper output\n")


@pytest.mark.parametrize("state", [None, Path.mkdir, prepared_for_this_recipe],
                         ids=["absent", "empty", "prepared_for_this_recipe"])
def test_an_abandoned_claim_leaves_the_directory_as_it_was_and_a_rerun_takes_it(state, tmp_path):
    """A trainer whose set-up fails after the claim (before its first event) abandons it: the
    directory byte for byte as found (absent stays absent), the lock released, a new claim works."""
    d = tmp_path / "deep" / "D"
    if state is not None:
        d.parent.mkdir(parents=True, exist_ok=True)
        state(d)
    before = snapshot(tmp_path)
    claim = rundir.claim(d, GRPO, 10, resume=False, main=True)
    assert (d / "run.json").is_file()
    claim.abandon()
    assert snapshot(tmp_path) == before and claim.lock is None
    rundir.claim(d, GRPO, 10, resume=False, main=True).release()
    assert rundir.recorded_recipe(d)["recipe_sha256"] == rundir.recipe_digest(GRPO)


def test_an_abandoned_resume_claim_leaves_the_run_as_it_was(tmp_path):
    d = tmp_path / "D"
    rundir.claim(d, GRPO, 10, resume=False, main=True).release()
    (d / ".lock").unlink()  # a run from before the lock file: the resume's claim creates it
    before = snapshot(d)
    claim = rundir.claim(d, GRPO, 10, resume=True, main=True)
    assert claim.resume and claim.lock is not None
    claim.abandon()
    assert snapshot(d) == before


def _older_version(recipe_yaml: str, drop: tuple[str, str]) -> str:
    """``recipe_yaml`` as a version without the defaulted field ``drop`` (section, key) wrote it."""
    import yaml

    data = yaml.safe_load(recipe_yaml)
    section, key = drop
    assert data[section][key] == load_recipe("grpo").model_dump()[section][key]  # at its default
    del data[section][key]
    return yaml.safe_dump(data, sort_keys=False)


def _fake_checkpoint(d: Path, step: int, recipe_sha256: str) -> Path:
    """The files a checkpoint must have (contents are not read by the verification) and its manifest."""
    from workbench.engine.checkpoint import checkpoint_dir, write_manifest

    p = checkpoint_dir(d, step)
    p.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng-rank0.pt"):
        (p / name).write_bytes(name.encode())
    (p / "trainer_state.json").write_text(f'{{"step": {step}, "world_size": 1}}')
    write_manifest(p, step, recipe_sha256)
    return p


@pytest.mark.parametrize("drop", [("train", "staleness"), ("logging", "lens_every"), ("checkpoint", "keep_last")],
                         ids=lambda f: ".".join(f))
def test_a_run_recorded_by_an_older_version_resumes_with_its_checkpoints(drop, tmp_path):
    """A later version adds a field with a default: the run recorded before it (run.json and
    recipe.yaml without the field, checkpoints' manifests with the old digest) still resumes from
    its checkpoint; the claim carries the recorded digest on into new manifests."""
    old = _older_version(GRPO, drop)
    d = tmp_path / "D"
    d.mkdir()
    (d / "recipe.yaml").write_text(old)
    (d / "run.json").write_text(json.dumps({"recipe_sha256": rundir.recipe_digest(old), "recipe": old}))
    ckpt = _fake_checkpoint(d, 3, rundir.recipe_digest(old))
    current = load_recipe(str(d / "recipe.yaml")).to_yaml()  # what `train --resume D` hands the claim
    assert current != old
    claim = rundir.claim(d, current, 10, resume=True, main=True)
    try:
        assert (claim.checkpoint, claim.warnings, claim.recipe_sha256) == (ckpt, [], rundir.recipe_digest(old))
    finally:
        claim.release()
    edited = load_recipe(str(d / "recipe.yaml"), ["optim.lr=0.5"]).to_yaml()  # a real edit is still refused
    with pytest.raises(rundir.RunDirError, match=r"field optim.lr 0.001 -> 0.5"):
        rundir.claim(d, edited, 10, resume=True, main=True)


def test_a_started_run_never_resumes_from_a_checkpoint_without_its_manifest(tmp_path):
    """run.json says the run's version writes manifests: a step-N folder without one is a save or
    a removal cut short (a crash mid-prune), never resumed, even with no verified one left."""
    d = tmp_path / "D"
    rundir.claim(d, GRPO, 10, resume=False, main=True).release()
    digest = rundir.recipe_digest(GRPO)
    for step in (1, 3):
        (_fake_checkpoint(d, step, digest) / "manifest.json").unlink()
    with pytest.raises(rundir.RunDirError, match=r"none of its 2 checkpoint\(s\) is intact.*manifest.json \(a save "
                                                 r"or a removal was cut short\)"):
        rundir.claim(d, GRPO, 10, resume=True, main=True)
    ok = _fake_checkpoint(d, 0, digest)
    claim = rundir.claim(d, GRPO, 10, resume=True, main=True)
    claim.release()
    assert claim.checkpoint == ok and "step-00000003 skipped: it has no manifest.json" in claim.warnings[0]


def test_the_other_ranks_verify_nothing(tmp_path):
    """Only the main process hashes the checkpoints; the others receive its choice at resume."""
    d = tmp_path / "D"
    claim = rundir.claim(d, GRPO, 10, resume=True, main=False)
    assert (claim.resume, claim.chosen, claim.lock, claim.checkpoint) == (True, False, None, None)
    assert not d.exists()


@pytest.mark.parametrize("where", ["/proc/self/wb-run", "a_file/run"])
def test_a_run_directory_the_file_system_refuses_is_one_line(where, tmp_path, fresh_home):
    """mkdir under /proc (ENOENT), or under a file (ENOTDIR): one line naming the directory and
    the system's reason, exit 2, nothing left behind."""
    (tmp_path / "a_file").write_text("x")
    d = where if where.startswith("/") else str(tmp_path / where)
    out = subprocess.run([sys.executable, "-m", "workbench", "train", "grpo", "--run-dir", d], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(f"error: run directory {d}: "), out.stderr
    assert not Path(d).exists()
