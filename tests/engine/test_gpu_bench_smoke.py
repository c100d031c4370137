"""bench/gpu_bench.py end to end on CPU (--smoke: the tiny model's GRPO against TRL's GRPOTrainer,
a few-thousand-parameter Llama's forward + backward), as a user runs it: one subprocess, its JSON
read back. The GPU figures themselves need a CUDA machine; this checks the script that takes them."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import missing_component

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_bench.py"


def run_bench(args: list[str], home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "WORKBENCH_HOME": str(home), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)


def finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_smoke_run_writes_every_figure(fresh_home, tmp_path):
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        missing_component("trl is not installed (requirements-bench.txt): the smoke run compares with TRL's GRPOTrainer")
    out = tmp_path / "smoke.json"
    # a peak is given so the MFU division is exercised on CPU (no table entry for a CPU)
    proc = run_bench(["--smoke", "--peak-tflops", "2.0", "--out", str(out)], fresh_home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())

    assert result["smoke"] is True and result["device"]["cuda"] is False
    g = result["grpo"]
    assert (g["work"]["model"], g["work"]["precision"], g["rounds"]) == ("tiny", "fp32", 2)
    assert finite_positive(g["num_parameters"])
    for system in ("trl", "workbench"):
        s = g[system]
        assert finite_positive(s["s_per_step"]) and finite_positive(s["tokens_per_s"]), s
        assert len(s["s_per_step_rounds"]) == 2 and all(finite_positive(t) for t in s["s_per_step_rounds"])
        assert s["s_per_step"] == min(s["s_per_step_rounds"])
        assert s["peak_memory_bytes"] is None  # CUDA's allocator only; nothing to read on CPU
        assert 0.0 <= s["reward_mean"] <= 10.0
    ratio = g["ratio"]
    assert ratio["best_over_best"] == pytest.approx(g["workbench"]["s_per_step"] / g["trl"]["s_per_step"], rel=1e-12)
    assert [ratio["per_round"][i] for i in (0, 1)] == pytest.approx(
        [w / t for w, t in zip(g["workbench"]["s_per_step_rounds"], g["trl"]["s_per_step_rounds"])], rel=1e-12)
    lo, med, hi = ratio["per_round_min_median_max"]
    assert all(finite_positive(x) for x in (lo, med, hi)) and lo <= med <= hi

    m = result["mfu"]
    # the smoke Llama, counted by hand: embedding 256x64 + 2 layers x (q 64x64 + k, v 64x32 + o 64x64 +
    # MLP 3 x 64x128 + 2 norms of 64) + final norm 64 + lm_head 64x256
    layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64
    assert m["num_parameters"] == 256 * 64 + 2 * layer + 64 + 64 * 256
    assert m["flop_parameters"] == m["num_parameters"] - 256 * 64  # the input embedding is a lookup
    assert m["tokens_per_iter"] == 2 * 32 and len(m["s_per_iter_runs"]) == 3
    assert all(finite_positive(m[k]) for k in ("s_per_iter", "tokens_per_s", "achieved_tflops"))
    # achieved FLOP/s = 6 N tokens / s; MFU = achieved / the given peak
    assert m["achieved_tflops"] == pytest.approx(6 * m["flop_parameters"] * 64 / m["s_per_iter"] / 1e12, rel=1e-12)
    assert (m["peak_tflops"], m["mfu"]) == (2.0, pytest.approx(m["achieved_tflops"] / 2.0, rel=1e-12))

    # the table names each figure
    for label in ("TRL", "workbench", "workbench / TRL s/step", "MFU", "TFLOP/s"):
        assert label in proc.stdout, (label, proc.stdout)


def test_bad_flag_is_one_error_line_and_exit_2(fresh_home, tmp_path):
    out = tmp_path / "never.json"
    proc = run_bench(["--smoke", "--warmup", "5", "--steps", "3", "--out", str(out)], fresh_home)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: --warmup=5 must be at least 1 and below --steps=3"]
    assert not out.exists()
