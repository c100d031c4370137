"""Run directories with real trainers (tiny model, subprocesses): a run directory is never reused
by another run, one trainer holds it, a resume loads only an intact checkpoint of its own run, and
a checkpoint that cannot be written leaves no temporary folder."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engine.stalling_rewards import STALL_ENV, STALLED_FILE_ENV
from tests.engine.test_rundir_claims import snapshot
from workbench.engine.checkpoint import (CheckpointError, MANIFEST_FILE, choose_resume_checkpoint, list_checkpoints,
                                         write_manifest)
from workbench.engine.events import read_events
from workbench.engine.rundir import recipe_digest
from workbench.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
STALLING = "reward_funcs=['tests.engine.stalling_rewards:exact_match_stalling']"


def _train(wb_home, *args, env=None):
    return subprocess.run([sys.executable, "-m", "workbench", "train", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "WORKBENCH_HOME": str(wb_home), **(env or {})})


def _refused(out) -> str:
    assert out.returncode == 2, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    return lines[0]


def test_a_second_run_never_reuses_a_run_directory(wb_home, tmp_path):
    """The issue's case: grpo 5 steps into D, then rloo 3 steps into D: refused, D byte for byte
    as the grpo run left it (final/, recipe.yaml, events, checkpoints)."""
    d = tmp_path / "D"
    first = _train(wb_home, "grpo", "--set", "train.steps=5", "--run-dir", str(d))
    assert first.returncode == 0, first.stderr[-3000:]
    before = snapshot(d)
    line = _refused(_train(wb_home, "rloo", "--set", "train.steps=3", "--run-dir", str(d)))
    assert "holds a run" in line and "train --resume" in line
    assert snapshot(d) == before


# -- one run with three checkpoints, damaged in every way the issue found ---------------------------
STEPS = ["--set", "train.steps=6", "--set", "checkpoint.every=2", "--set", "checkpoint.keep_last=3"]


@pytest.fixture(scope="module")
def three_checkpoints(wb_home, few_problems, tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpts") / "run"
    out = _train(wb_home, "grpo", *STEPS, "--set", f"dataset={few_problems}", "--run-dir", str(d))
    assert out.returncode == 0, out.stderr[-3000:]
    assert [s for s, _ in list_checkpoints(d)] == [1, 3, 5]
    return d


def _flip_bytes(p: Path) -> None:
    data = bytearray((p / "model.safetensors").read_bytes())
    data[-100:-90] = bytes(b ^ 0xFF for b in data[-100:-90])  # inside the tensors: same size
    (p / "model.safetensors").write_bytes(bytes(data))


def _state_step(value, *, manifest_too: bool = False):
    """trainer_state.json claims another step; ``manifest_too``: the manifest rewritten to match
    the edited files (a deliberate edit, not damage), so only the step itself can give it away."""
    def damage(p: Path) -> None:
        state = json.loads((p / "trainer_state.json").read_text())
        (p / "trainer_state.json").write_text(json.dumps({**state, "step": value}))
        if manifest_too:
            old = json.loads((p / MANIFEST_FILE).read_text())
            write_manifest(p, old["step"], old["recipe_sha256"])
    damage.__name__ = f"state_step_{value}" + ("_manifest_rewritten" if manifest_too else "")
    return damage


def _truncate(p: Path) -> None:
    f = p / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _remove(name):
    def damage(p: Path) -> None:
        (p / name).unlink()
    damage.__name__ = f"missing_{name}"
    return damage


def _renamed_out_of_range(p: Path) -> None:
    p.rename(p.with_name("step-00000999"))


# every way the issue (and its neighbours) damaged a checkpoint, with the reason the warning gives
DAMAGES = {
    _flip_bytes: "model.safetensors does not match its checksum (damaged)",
    _truncate: "model.safetensors has",
    _state_step(999): "trainer_state.json has",
    _state_step(-5): "trainer_state.json has",
    _state_step(999, manifest_too=True): "trainer_state.json says step 999",
    _state_step(-5, manifest_too=True): "trainer_state.json says step -5",
    _remove("optimizer.pt"): "optimizer.pt is missing",
    _remove("rng-rank0.pt"): "rng-rank0.pt is missing",
    _remove("scheduler.pt"): "scheduler.pt is missing",
    _remove(MANIFEST_FILE): "has no manifest.json",
    _renamed_out_of_range: "step 999 is outside this run's steps 0..5",
}


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda f: f.__name__.strip("_"))
def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one(three_checkpoints, damage, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(three_checkpoints, d)
    damage(d / "checkpoints" / "step-00000005")
    digest = recipe_digest((d / "recipe.yaml").read_text())
    path, warnings = choose_resume_checkpoint(d, 6, digest)
    assert path.name == "step-00000003"
    assert warnings[0].startswith("checkpoint step-00000") and " skipped: " in warnings[0]
    assert DAMAGES[damage] in warnings[0]
    assert warnings[-1] == "resumed from step-00000003, the newest intact checkpoint"


def test_a_checkpoint_of_another_recipe_is_not_resumed(three_checkpoints, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(three_checkpoints, d)
    with pytest.raises(CheckpointError, match="written by another recipe"):
        choose_resume_checkpoint(d, 6, recipe_digest("name: another\n"))


def test_a_run_from_before_manifests_resumes_from_its_newest_checkpoint_with_a_warning(three_checkpoints, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(three_checkpoints, d)
    for manifest in d.glob(f"checkpoints/*/{MANIFEST_FILE}"):
        manifest.unlink()
    path, warnings = choose_resume_checkpoint(d, 6, recipe_digest((d / "recipe.yaml").read_text()))
    assert path.name == "step-00000005" and "could not be verified" in warnings[-1]


E2E_DAMAGES = [f for f in DAMAGES if f.__name__.strip("_") in
               ("flip_bytes", "truncate", "missing_optimizer.pt", "missing_rng-rank0.pt")]


@pytest.mark.parametrize("damage", E2E_DAMAGES, ids=lambda f: f.__name__.strip("_"))
def test_resume_skips_a_damaged_checkpoint_says_so_and_finishes(wb_home, three_checkpoints, damage, tmp_path):
    """End to end, the issue's cases (flipped bytes, truncated weights, a missing optimiser or RNG
    file) in the newest checkpoint: `train --resume` continues from
    step 3, trains steps 4 and 5 once, ends finished, and the resume event carries the warning,
    which the run store records among the run's warnings."""
    from workbench.runs import RunStore

    d = tmp_path / "run"
    shutil.copytree(three_checkpoints, d)
    damage(d / "checkpoints" / "step-00000005")
    events_before = len(read_events(d))
    out = _train(wb_home, "--resume", str(d))
    assert out.returncode == 0, out.stderr[-3000:]
    new = read_events(d)[events_before:]
    resume = [e for e in new if e["kind"] == "resume"]
    assert len(resume) == 1 and (resume[0]["step"], Path(resume[0]["checkpoint"]).name) == (4, "step-00000003")
    assert f"checkpoint step-00000005 skipped: {DAMAGES[damage]}" in resume[0]["warnings"][0]
    assert [e["step"] for e in new if e["kind"] == "metrics"] == [4, 5]
    assert [e["status"] for e in new if e["kind"] == "status"][-1] == "finished"

    store = RunStore(tmp_path / "store.db")
    recipe = load_recipe(str(d / "recipe.yaml"))
    store.create_run(run_id="r1", name="r1", algorithm="grpo", recipe_yaml=recipe.to_yaml(), total_steps=6,
                     target="local", launcher="local", host="localhost", created_by="t", run_dir=str(d))
    store.ingest("r1", read_events(d))
    run = store.get_run("r1")
    assert run["status"] == "finished"
    assert any(f"step-00000005 skipped: {DAMAGES[damage]}" in w for w in run["warnings"])


def test_resume_with_no_intact_checkpoint_is_one_line_and_touches_nothing(wb_home, three_checkpoints, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(three_checkpoints, d)
    for ckpt in d.glob("checkpoints/step-*"):
        _truncate(ckpt)
    before = snapshot(d)
    line = _refused(_train(wb_home, "--resume", str(d)))
    assert "none of its 3 checkpoint(s) is intact" in line and "step-00000005: model.safetensors has" in line
    after = snapshot(d)
    after.pop(".lock", None), before.pop(".lock", None)
    assert after == before


@pytest.mark.parametrize("step", [999, -5])
def test_resume_refuses_checkpoints_whose_step_is_not_theirs(wb_home, three_checkpoints, step, tmp_path):
    """Every checkpoint's trainer_state.json claims a step outside the run (manifests rewritten to
    match, so only the step gives it away): one line naming why, nothing trained or written."""
    d = tmp_path / "run"
    shutil.copytree(three_checkpoints, d)
    for ckpt in d.glob("checkpoints/step-*"):
        _state_step(step, manifest_too=True)(ckpt)
    events = (d / "events.jsonl").read_bytes()
    line = _refused(_train(wb_home, "--resume", str(d)))
    assert "none of its 3 checkpoint(s) is intact" in line and f"trainer_state.json says step {step}" in line
    assert (d / "events.jsonl").read_bytes() == events


EDITS = {"optim.lr": ("lr: 0.001", "lr: 0.5", "field optim.lr 0.001 -> 0.5"),
         "algorithm.advantage": ("advantage: grpo", "advantage: rloo", "field algorithm.advantage 'grpo' -> 'rloo'")}


@pytest.mark.parametrize("field", EDITS)
def test_resume_refuses_an_edited_recipe(wb_home, three_checkpoints, field, tmp_path):
    """The issue's edits (an lr that would be silently ignored, an advantage that would change
    mid-run): refused in one line naming the field, the run's files untouched."""
    old, new, said = EDITS[field]
    d = tmp_path / "run"
    shutil.copytree(three_checkpoints, d)
    text = (d / "recipe.yaml").read_text()
    assert old in text
    (d / "recipe.yaml").write_text(text.replace(old, new))
    before = snapshot(d)
    line = _refused(_train(wb_home, "--resume", str(d)))
    assert f"{said}; a resume runs the recorded recipe" in line
    after = snapshot(d)
    after.pop(".lock", None), before.pop(".lock", None)
    assert after == before


# -- one trainer per run directory -------------------------------------------------------------------
def _wait_for(predicate, what: str, proc, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert proc.poll() is None, f"the trainer ended ({proc.returncode}) before {what}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_two_resumes_at_once_the_second_is_refused(wb_home, few_problems, tmp_path):
    """The issue's case: a run killed -9 at step 1, then two `train --resume D` at once. The first
    holds D (stalled inside step 2 by the stalling reward); the second resume, and a new run
    pointed at D, get one line, exit 2, and D's events do not change."""
    d = tmp_path / "D"
    args = ["grpo", "--set", "train.steps=4", "--set", "checkpoint.every=1", "--set", f"dataset={few_problems}",
            "--set", STALLING]

    stalled = tmp_path / "stalled"

    def start(*extra, stall: int):
        return subprocess.Popen([sys.executable, "-m", "workbench", "train", *extra], cwd=ROOT,
                                env={**os.environ, "WORKBENCH_HOME": str(wb_home), STALL_ENV: str(stall),
                                     STALLED_FILE_ENV: str(stalled)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    crashed = start(*args, "--run-dir", str(d), stall=1)
    try:
        _wait_for(lambda: [s for s, _ in list_checkpoints(d)] == [0], "the checkpoint of step 0", crashed)
    finally:
        crashed.kill()
        crashed.wait(timeout=30)
    stalled.unlink(missing_ok=True)  # the killed attempt may or may not have reached its stall
    first = start("--resume", str(d), stall=2)
    try:
        # asleep in step 2's reward: step 1's record (metrics, samples, lens) is whole and nothing
        # more is written (a snapshot taken at step 1's metrics line raced its samples line in CI)
        _wait_for(stalled.exists, "the resumed run's stall in step 2", first)
        assert any(e["kind"] == "metrics" and e["step"] == 1 for e in read_events(d))
        events = (d / "events.jsonl").read_bytes()
        line = _refused(_train(wb_home, "--resume", str(d)))
        assert f"is in use by a live trainer (pid {first.pid})" in line
        line = _refused(_train(wb_home, *args, "--run-dir", str(d)))
        assert f"a live trainer (pid {first.pid}) is writing it" in line
        assert (d / "events.jsonl").read_bytes() == events
        assert first.poll() is None
    finally:
        first.kill()
        first.wait(timeout=30)


# -- a full disk at a checkpoint ----------------------------------------------------------------------
def _small_tmpfs(d: Path):
    """``d`` on a 1 MiB tmpfs (a disk that fills at the first checkpoint): needs root."""
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root (the file_size_limit case runs without)")
    return (lambda: subprocess.run(["umount", str(d)], check=False)), None, "No space left on device"


def _file_size_limit(d: Path):
    """A 1 MiB RLIMIT_FSIZE on the trainer: the kernel refuses the checkpoint's larger writes
    (EFBIG; Python ignores SIGXFSZ), as a full disk would refuse them, and no root is needed."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    return (lambda: None), limit, "File too large"


@pytest.mark.parametrize("fault", [_small_tmpfs, _file_size_limit], ids=lambda f: f.__name__.strip("_"))
def test_a_checkpoint_that_does_not_fit_leaves_no_temporary_folder(wb_home, few_problems, fault, tmp_path):
    """The checkpoint (~5 MB) cannot be written: the run ends failed (exit 1) with the cause in its
    events and in the run store, and no `.tmp-step-*` folder is left to keep the disk full."""
    from workbench.runs import RunStore

    d = tmp_path / "small"
    d.mkdir()
    undo, preexec, cause = fault(d)
    try:
        run = d / "run"
        out = subprocess.run([sys.executable, "-m", "workbench", "train", "grpo", "--set", "train.steps=2", "--set",
                              f"dataset={few_problems}", "--set", "checkpoint.every=1", "--run-dir", str(run)],
                             cwd=ROOT, capture_output=True, text=True, timeout=600, preexec_fn=preexec,
                             env={**os.environ, "WORKBENCH_HOME": str(wb_home)})
        assert out.returncode == 1, out.stderr[-3000:]
        errors = [e for e in read_events(run) if e["kind"] == "error"]
        assert errors and cause in errors[-1]["error"]
        assert list((run / "checkpoints").glob(".tmp-*")) == [] and list_checkpoints(run) == []

        store = RunStore(tmp_path / "store.db")
        store.create_run(run_id="r1", name="r1", algorithm="grpo", recipe_yaml=(run / "recipe.yaml").read_text(),
                         total_steps=2, target="local", launcher="local", host="localhost", created_by="t",
                         run_dir=str(run))
        store.ingest("r1", read_events(run))
        row = store.get_run("r1")
        assert row["status"] == "failed" and cause in (row["error"] or "")
    finally:
        undo()
