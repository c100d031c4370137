"""The engine as users start it: the CLI in a real subprocess, SIGTERM, and two data-parallel
processes under ``accelerate launch`` (gloo on CPU)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.engine.events import read_events
from workbench.engine.models import load_policy
from workbench.engine.trainer import parameter_digest
from workbench.recipe import RECIPES_DIR

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args, env_home, timeout=300):
    env = {**os.environ, "WORKBENCH_HOME": str(env_home), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_cli_recipes_and_model(wb_home):
    listed = run_cli("recipes", "list", env_home=wb_home)
    assert listed.returncode == 0
    assert [line.split()[0] for line in listed.stdout.splitlines()] == sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
    assert {"cispo", "dapo", "dr_grpo", "grpo", "gspo", "ppo", "reinforce_pp", "rloo", "sapo", "remax"} <= set(listed.stdout.split())
    shown = run_cli("recipes", "show", "dapo", env_home=wb_home)
    assert "arXiv:2503.14476" in shown.stdout and "eps_high: 0.28" in shown.stdout
    missing = run_cli("recipes", "show", "ppo2", env_home=wb_home)
    assert missing.returncode == 2 and "unknown preset 'ppo2'; presets: cispo, clip_cov, dapo" in missing.stderr
    built = run_cli("model", "build", "tiny", env_home=wb_home)
    assert built.returncode == 0 and (Path(built.stdout.strip()) / "config.json").exists()


def test_cli_train_and_bad_override(wb_home, few_problems, tmp_path):
    ok = run_cli("train", "grpo", "--set", "train.steps=3", "--set", f"dataset={few_problems}", "--run-dir", str(tmp_path / "r"), env_home=wb_home)
    assert ok.returncode == 0, ok.stderr
    assert [e["step"] for e in read_events(tmp_path / "r") if e["kind"] == "metrics"] == [0, 1, 2]
    assert (tmp_path / "r" / "recipe.yaml").exists()
    failed = run_cli("train", "grpo", "--set", "train.steps=4", "--set", f"dataset={few_problems}",
                     "--set", "reward_funcs=['tests.engine.faulty_rewards:raises_at_step_2']", "--run-dir", str(tmp_path / "f"), env_home=wb_home)
    assert failed.returncode == 1 and f"failed: {tmp_path / 'f'}" in failed.stderr
    bad = run_cli("train", "grpo", "--set", "algorithm.advantage=ppo", env_home=wb_home)
    assert bad.returncode == 2
    assert "algorithm.advantage='ppo'" in bad.stderr and "choose one of: grpo, rloo" in bad.stderr


def test_sigterm_ends_run_cancelled_and_keeps_steps(wb_home, few_problems, tmp_path):
    env = {**os.environ, "WORKBENCH_HOME": str(wb_home), "PYTHONPATH": str(ROOT)}
    run_dir = tmp_path / "r"
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "train", "grpo", "--set", "train.steps=10000",
                             "--set", f"dataset={few_problems}", "--run-dir", str(run_dir)], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and sum(e["kind"] == "metrics" for e in read_events(run_dir)) < 3:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    events = read_events(run_dir)
    steps = [e["step"] for e in events if e["kind"] == "metrics"]
    assert len(steps) >= 3 and steps == list(range(len(steps)))
    assert events[-1]["kind"] == "status" and events[-1]["status"] == "cancelled"


def launch_two_processes(wb_home, port: int, *train_args: str, timeout: int = 400) -> subprocess.CompletedProcess:
    """``accelerate launch`` of ``workbench train ...`` on two CPU processes (gloo)."""
    env = {**os.environ, "WORKBENCH_HOME": str(wb_home), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
           "-m", "workbench", "train", *train_args]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def linear_schedule(lr: float, warmup: int, total: int, updates: int) -> float:
    """transformers' linear schedule after ``updates`` optimiser updates, written out by hand."""
    if updates < warmup:
        return lr * updates / warmup
    return lr * max(0.0, (total - updates) / (total - warmup))


def test_two_process_data_parallel(wb_home, few_problems, tmp_path):
    """accelerate launch --multi_gpu --num_processes 2 with Accelerator(cpu=True): both ranks end
    with identical parameters, the metrics describe the global batch of both ranks, and the LR
    schedule advances once per optimiser update (not once per rank)."""
    run_dir = tmp_path / "ddp"
    res = launch_two_processes(wb_home, 29533, "ppo", "--set", "train.steps=4", "--set", f"dataset={few_problems}",
                               "--set", "optim.schedule=linear", "--set", "optim.warmup_steps=6", "--run-dir", str(run_dir))
    assert res.returncode == 0, res.stderr[-3000:]
    digests = [(run_dir / f"params.rank{r}.sha256").read_text() for r in (0, 1)]
    assert digests[0] == digests[1]
    events = read_events(run_dir)
    assert [e for e in events if e["kind"] == "status"][0]["world_size"] == 2
    ms = [e["metrics"] for e in events if e["kind"] == "metrics"]
    assert len(ms) == 4
    assert all(m["completions/count"] == 32 for m in ms)  # 4 prompts x 8, across both ranks
    # ppo: mu 2 x 2 minibatches = 4 updates per step, 16 in all; after step s, 4 (s + 1) updates:
    # 1e-3 x [4/6 (warm-up), (16-8)/10, (16-12)/10, 0] (a scheduler stepped per rank runs 2x faster)
    expected = [linear_schedule(1e-3, 6, 16, 4 * (s + 1)) for s in range(4)]
    assert expected == pytest.approx([4e-3 / 6, 8e-4, 4e-4, 0.0])
    assert [m["lr"] for m in ms] == pytest.approx(expected, rel=1e-6, abs=1e-12)
    # ... and the identical parameters are not simply the untouched start: both ranks updated
    initial, _ = load_policy("tiny")
    assert digests[0] != parameter_digest(initial)


def test_two_processes_stay_in_sync_with_the_shared_prefix_and_one_token_completions(wb_home, few_problems, tmp_path):
    """train.shared_prefix (the default): the prompt pass goes around DDP when a completion pass
    follows through it. With 1-token completions the prompt pass is the only forward; it went
    around DDP too, no gradient was all-reduced and the ranks drifted apart (review of issue 20)."""
    run_dir = tmp_path / "t1"
    res = launch_two_processes(wb_home, 29541, "grpo", "--set", "train.steps=2", "--set", f"dataset={few_problems}",
                               "--set", "sampling.max_completion_length=1", "--run-dir", str(run_dir))
    assert res.returncode == 0, res.stderr[-3000:]
    digests = [(run_dir / f"params.rank{r}.sha256").read_text() for r in (0, 1)]
    assert digests[0] == digests[1] != parameter_digest(load_policy("tiny")[0])
