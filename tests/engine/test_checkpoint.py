"""Checkpoints, resume after kill -9 and the final model directory (workbench/engine/checkpoint.py),
with the tiny model in real subprocesses."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engine.stalling_rewards import STALL_ENV
from workbench.engine.checkpoint import (FINAL_DIR, checkpoint_due, drop_torn_tail, final_model_dir,
                                         list_checkpoints, resume_start)
from workbench.engine.events import read_events
from workbench.engine.models import resolve_model
from workbench.engine.trainer import parameter_digest

ROOT = Path(__file__).resolve().parents[2]
STALLING = "reward_funcs=['tests.engine.stalling_rewards:exact_match_stalling']"


def test_checkpoint_due_every_n_steps_and_at_the_end():
    assert [s for s in range(7) if checkpoint_due(s, 3, 6)] == [2, 5, 6]
    assert [s for s in range(7) if checkpoint_due(s, 0, 6)] == [6]  # 0: only at the end
    assert [s for s in range(4) if checkpoint_due(s, 1, 3)] == [0, 1, 2, 3]


def test_drop_torn_tail_keeps_complete_lines_only(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": ')
    assert drop_torn_tail(path) == 6
    assert path.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    assert drop_torn_tail(path) == 0 and path.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    path.write_bytes(b"torn without any newline")
    assert drop_torn_tail(path) == 24 and path.read_bytes() == b""


def test_only_complete_checkpoints_count(tmp_path):
    for name, complete in (("step-00000001", True), ("step-00000003", False), (".tmp-step-00000005", True),
                           ("step-00000002", True)):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
        if complete:
            (tmp_path / "checkpoints" / name / "trainer_state.json").write_text("{}")
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1, 2]
    assert resume_start(tmp_path) == 3
    assert resume_start(tmp_path / "none") == 0


def _env(wb_home, **extra):
    return {**os.environ, "WORKBENCH_HOME": str(wb_home), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra}


def _train(wb_home, *args, env_extra=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "workbench", "train", *args], env=_env(wb_home, **(env_extra or {})),
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _metrics_by_step(run_dir: Path) -> dict[int, dict]:
    """Step -> metrics of the events file, the last line of a step winning (a resumed attempt's
    lines come after the crashed one's), without the timings."""
    out = {}
    for e in read_events(run_dir):
        if e["kind"] == "metrics":
            out[e["step"]] = {k: v for k, v in e["metrics"].items() if not k.startswith("perf/") or k == "perf/tokens"}
    return out


def _final_digest(run_dir: Path) -> str:
    from transformers import AutoModelForCausalLM

    return parameter_digest(AutoModelForCausalLM.from_pretrained(run_dir / FINAL_DIR))


def test_kill_9_after_a_checkpoint_then_resume_equals_an_uninterrupted_run(wb_home, few_problems, tmp_path):
    """PPO (critic, 2 epochs x 2 minibatches, linear warm-up/decay schedule), checkpoint every 2
    steps. The first attempt stalls inside step 3 after the checkpoint of step 1 and step 2's
    events, and is killed with SIGKILL; `train --resume` continues at step 2 in the same run dir.
    One CPU thread: parameters and every metric equal the uninterrupted run's exactly."""
    overrides = ["--set", "train.steps=5", "--set", f"dataset={few_problems}", "--set", "checkpoint.every=2",
                 "--set", "optim.schedule=linear", "--set", "optim.warmup_steps=3", "--set", STALLING]
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    ok = _train(wb_home, "ppo", *overrides, "--run-dir", str(straight))
    assert ok.returncode == 0, ok.stderr[-3000:]

    proc = subprocess.Popen([sys.executable, "-m", "workbench", "train", "ppo", *overrides, "--run-dir", str(crashed)],
                            env=_env(wb_home, **{STALL_ENV: "3"}), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and not (2 in _metrics_by_step(crashed) and list_checkpoints(crashed)):
        time.sleep(0.1)
    time.sleep(0.5)  # it is asleep in step 3's reward now: it cannot reach the next checkpoint (after step 3)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert [s for s, _ in list_checkpoints(crashed)] == [1]
    assert sorted(_metrics_by_step(crashed)) == [0, 1, 2]  # step 2 ran past the checkpoint: the resume redoes it
    assert final_model_dir(crashed) is None
    with open(crashed / "events.jsonl", "ab") as f:
        f.write(b'{"kind": "metrics", "st')  # a line torn by the kill

    resumed = _train(wb_home, "--resume", str(crashed))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"finished: {crashed}" in resumed.stderr

    events = read_events(crashed)
    resume_events = [e for e in events if e["kind"] == "resume"]
    assert [(e["step"], Path(e["checkpoint"]).name) for e in resume_events] == [(2, "step-00000001")]
    after_resume = events[events.index(resume_events[0]):]
    assert [e["step"] for e in after_resume if e["kind"] == "metrics"] == [2, 3, 4]
    assert [e["status"] for e in events if e["kind"] == "status"] == ["starting", "running", "starting", "running", "finished"]
    assert _metrics_by_step(crashed) == _metrics_by_step(straight)  # exactly, step by step (lr, losses, kl, ...)
    assert _final_digest(crashed) == _final_digest(straight)
    assert [s for s, _ in list_checkpoints(crashed)] == [4]  # keep_last 1; the end is always saved


def test_final_directory_loads_with_from_pretrained_and_resume_refuses_a_changed_recipe(wb_home, few_problems, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir = tmp_path / "r"
    ok = _train(wb_home, "grpo", "--set", "train.steps=2", "--set", f"dataset={few_problems}", "--run-dir", str(run_dir))
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert final_model_dir(run_dir) == run_dir / FINAL_DIR
    model = AutoModelForCausalLM.from_pretrained(run_dir / FINAL_DIR)
    tokenizer = AutoTokenizer.from_pretrained(run_dir / FINAL_DIR)
    assert model.config.model_type == "llama" and tokenizer("3+2=")["input_ids"]
    # the final policy equals the last checkpoint's and differs from the starting weights
    last = AutoModelForCausalLM.from_pretrained(list_checkpoints(run_dir)[-1][1])
    start = AutoModelForCausalLM.from_pretrained(resolve_model("tiny"))
    assert parameter_digest(model) == parameter_digest(last) != parameter_digest(start)

    changed = _train(wb_home, "--resume", str(run_dir), "--set", "train.steps=9")
    assert changed.returncode == 2
    assert changed.stderr.strip() == ("error: --resume RUN_DIR takes the run's own recipe.yaml: give no RECIPE, --set "
                                      "or --run-dir with it")
    missing = _train(wb_home, "--resume", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "has no recipe.yaml" in missing.stderr
    assert not (tmp_path / "nothing").exists()


def test_two_process_checkpoint_and_resume_match_the_uninterrupted_run(wb_home, few_problems, tmp_path):
    """accelerate launch, 2 CPU processes (gloo): rank 0 writes the model files, each rank its RNG.
    A copy of the run cut back to its step-1 checkpoint (as a crash after it would leave it)
    resumes on 2 processes to the same parameters on both ranks and the same metrics; on 1
    process the resume is refused, naming the process count."""
    import shutil

    from tests.engine.test_process import launch_two_processes

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    overrides = ["--set", "train.steps=4", "--set", f"dataset={few_problems}", "--set", "checkpoint.every=2",
                 "--set", "checkpoint.keep_last=2"]
    res = launch_two_processes(wb_home, 29541, "grpo", *overrides, "--run-dir", str(whole))
    assert res.returncode == 0, res.stderr[-3000:]
    steps = [s for s, _ in list_checkpoints(whole)]
    assert steps == [1, 3] and sorted(p.name for p in (whole / "checkpoints" / "step-00000001").glob("rng-rank*.pt")) == \
        ["rng-rank0.pt", "rng-rank1.pt"]
    shutil.copytree(whole, cut)
    shutil.rmtree(cut / "checkpoints" / "step-00000003")
    shutil.rmtree(cut / FINAL_DIR)
    res = launch_two_processes(wb_home, 29542, "--resume", str(cut))
    assert res.returncode == 0, res.stderr[-3000:]
    assert _metrics_by_step(cut) == _metrics_by_step(whole)
    assert _final_digest(cut) == _final_digest(whole)
    assert (cut / "params.rank0.sha256").read_text() == (cut / "params.rank1.sha256").read_text() == \
        (whole / "params.rank0.sha256").read_text()

    single = tmp_path / "single"
    shutil.copytree(whole, single)
    refused = _train(wb_home, "--resume", str(single))
    assert refused.returncode == 1
    error = [e for e in read_events(single) if e["kind"] == "error"][-1]["error"]
    assert error == (f"CheckpointError: checkpoint {single / 'checkpoints' / 'step-00000003'} was written by 2 processes; "
                     "resume it with 2 (this run has 1)")
