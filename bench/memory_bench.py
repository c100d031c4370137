"""Is the memory estimate an upper bound? machine.memory_footprint against a measured peak RSS.

    python bench/memory_bench.py [--model smollm2-135m] [--only full_kl lora ...] [--set key=value ...]

For each setting (full fine-tuning with a KL reference copy, full without KL, LoRA r=16, LoRA +
gradient checkpointing, LoRA + checkpointing + bf16) one real ``python -m workbench train grpo``
runs in its own process (one step, one thread) and its peak resident set is read from the
kernel when it ends (``os.wait4``: ru_maxrss of that process and anything it waited for). The
estimate is ``memory_footprint(recipe).total`` of the very same recipe (prompts truncated to
``sampling.max_prompt_length``, so the estimate's sequence length is the run's).

The RSS also holds what the estimate leaves out on purpose: the interpreter, torch /
transformers / peft / accelerate and their kernels. A baseline process that imports the trainer
(and so all of them) and loads no model is measured the same way; ``peak - baseline`` is what
the estimate has to bound. Printed per setting: estimate, peak, baseline, peak - baseline,
(peak - baseline) / estimate, and the run's longest completion and prompt truncation (a
completion that stops early makes the run smaller than the estimate assumes).

Runs one process at a time (the peak of one must not be shared with another); ~1 min per setting
on a 2-core CPU, plus ~45 s once to convert SmolLM2 into a scratch WORKBENCH_HOME.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: A system prompt longer than max_prompt_length: every prompt is cut to exactly that many tokens,
#: so the run's sequences are as long as the estimate assumes (a conversational task: templated).
SYSTEM_PROMPT = ("You are a careful and patient assistant who solves arithmetic problems for students. "
                 "Read the whole question, work through every operation in order, check each "
                 "intermediate result twice, and write the final answer as a single integer on "
                 "the last line, without units, commentary or any other text around it.")
#: One step of 4 prompts x 4 completions = 16 rows of 64 prompt + 64 completion tokens: a batch
#: big enough that activations are about half of the estimate, small enough for ~1 min on a CPU.
COMMON = ["task=reasoning_gym/basic_arithmetic", "sampling.num_generations=4", "sampling.prompts_per_step=4", "sampling.max_prompt_length=64",
          "sampling.max_completion_length=64", f"system_prompt={SYSTEM_PROMPT}", "train.steps=1",
          "train.threads=1", "eval.every=0"]
SETTINGS = {
    "full_kl": ["algorithm.kl_coef=0.04"],
    "full_no_kl": ["algorithm.kl_coef=0"],
    "lora": ["lora.r=16"],
    "lora_ckpt": ["lora.r=16", "train.gradient_checkpointing=true"],
    "lora_ckpt_bf16": ["lora.r=16", "train.gradient_checkpointing=true", "train.precision=bf16"],
}
BASELINE = "import workbench.engine.trainer"  # torch, transformers, peft, accelerate: no model
MIB = 2**20


def peak_rss(cmd: list[str], env: dict[str, str]) -> tuple[int, int, float]:
    """(exit status, peak RSS in bytes, wall seconds) of ``cmd`` run to its end.

    os.wait4 returns that child's own rusage: ru_maxrss (KiB on Linux) is the larger of its
    high-water mark and those of the children it reaped, not the maximum over every process
    this script ever started (RUSAGE_CHILDREN would be)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        sys.stderr.write(stderr[-2000:])
    return proc.returncode, usage.ru_maxrss * 1024, time.perf_counter() - start


def run_facts(run_dir: Path) -> dict[str, float]:
    """The run's longest completion and prompt truncation ratio (first step's metrics)."""
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        metrics = json.loads(line).get("metrics") or {}
        if "completions/max_length" in metrics:
            return {k: metrics.get(k, float("nan")) for k in ("completions/max_length", "prompts/truncated_ratio")}
    return {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--only", nargs="*", choices=sorted(SETTINGS), help="settings to run (default: all)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more overrides, for every setting")
    args = parser.parse_args()

    home = Path(os.environ.get("WORKBENCH_HOME") or tempfile.mkdtemp(prefix="wb-memory-"))
    env = {**os.environ, "WORKBENCH_HOME": str(home), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    os.environ["WORKBENCH_HOME"] = str(home)
    from workbench.model_facts import format_bytes
    from workbench.machine import memory_footprint
    from workbench.recipe import load_recipe

    py = sys.executable
    convert = f"from workbench.engine.models import resolve_model; resolve_model({args.model!r})"
    rc, _, wall = peak_rss([py, "-c", convert], env)  # once, outside any measured run
    assert rc == 0, f"converting {args.model} failed"
    print(f"home {home}; {args.model} ready ({wall:.0f} s)")
    rc, baseline, _ = peak_rss([py, "-c", BASELINE], env)
    assert rc == 0, "the baseline import failed"
    print(f"baseline ({BASELINE}): peak RSS {format_bytes(baseline)}")
    sets = [a for o in [f"model={args.model}", *COMMON, *args.set] for a in ("--set", o)]
    print("each setting runs:", shlex.join(["python", "-m", "workbench", "train", "grpo", *sets]), "--set ...")

    header = f"{'setting':<16}{'estimate':>11}{'peak':>11}{'peak-base':>11}{'ratio':>7}{'wall':>6}  longest completion, prompts truncated; parts"
    print(header)
    for name in args.only or SETTINGS:
        overrides = [f"model={args.model}", *COMMON, *SETTINGS[name], *args.set]
        footprint = memory_footprint(load_recipe("grpo", overrides))
        run_dir = home / "runs" / f"memory-{name}-{int(time.time())}"
        cmd = [py, "-m", "workbench", "train", "grpo", "--run-dir", str(run_dir), *(a for o in overrides for a in ("--set", o))]
        rc, peak, wall = peak_rss(cmd, env)
        if rc:
            print(f"{name:<16} failed (exit {rc})")
            continue
        facts = run_facts(run_dir)
        print(f"{name:<16}{format_bytes(footprint.total):>11}{format_bytes(peak):>11}{format_bytes(peak - baseline):>11}"
              f"{(peak - baseline) / footprint.total:>7.2f}{wall:>5.0f}s  "
              f"{facts.get('completions/max_length', float('nan')):.0f}, {facts.get('prompts/truncated_ratio', float('nan')):.2f}; "
              f"{footprint.describe()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
