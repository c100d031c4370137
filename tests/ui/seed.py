"""Runs in a real RunStore (SQLite) filled with engine-shaped events, without training anything."""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path

from workbench.home import workbench_home
from workbench.recipe import load_recipe
from workbench.runs import RunStore


def metrics_event(step: int, t: float, offset: float = 0.0) -> dict:
    """The metrics line the trainer writes at ``step`` (values are simple functions of step)."""
    return {"kind": "metrics", "step": step, "time": t, "metrics": {
        "reward": round(offset + 0.01 * step, 6), "reward_std": 0.3, "frac_reward_zero_std": 0.25,
        "kl": 0.001 * step, "entropy": 2.0 - 0.001 * step, "clip_ratio/low_mean": 0.01, "clip_ratio/high_mean": 0.02,
        "clip_ratio/region_mean": 0.03, "completions/mean_length": 5.0, "completions/min_length": 2.0,
        "completions/max_length": 6.0, "completions/clipped_ratio": 0.1, "completions/count": 32.0,
        "loss/policy": math.sin(step) * 0.1, "grad_norm": 1.0, "perf/step_time": 0.5, "perf/tokens_per_s": 320.0,
        "lr": 1e-3, "step": step}}


def samples_event(step: int, t: float) -> dict:
    return {"kind": "samples", "step": step, "time": t, "samples": [
        {"prompt": "3+2=", "completion": "5", "reward": 1.0, "advantage": 0.5, "length": 1, "truncated": False},
        {"prompt": "7-4=", "completion": "9", "reward": 0.0, "advantage": -0.5, "length": 1, "truncated": False}]}


def add_run(store: RunStore, *, preset: str = "grpo", name: str | None = None, steps: int = 3, total: int = 10,
            status: str = "finished", group: str | None = None, tags=(), notes: str = "", owner: str = "alice",
            reward_offset: float = 0.0, run_id: str | None = None, t0: float | None = None,
            extra_metrics=None, seed: int | None = None) -> str:
    """Register a run row and ingest ``steps`` steps of metrics + samples; returns its id.
    ``extra_metrics(step) -> dict``: more metrics logged at each step (names beyond the base line).
    ``seed``: the recipe's train.seed (the preset's by default); runs of one arm in a group need
    distinct seeds (the store refuses a copy)."""
    recipe = load_recipe(preset, [] if seed is None else [f"train.seed={seed}"])
    run_id = run_id or f"{name or preset}-{len(store.runs())}"
    store.create_run(run_id=run_id, name=name or preset, algorithm=recipe.name, recipe_yaml=recipe.to_yaml(),
                     total_steps=total, target="local", launcher="local", host="localhost", created_by=owner,
                     run_dir=str(run_dir(run_id)), group=group, tags=tags, notes=notes)
    t0 = time.time() - steps if t0 is None else t0
    events = [{"kind": "status", "step": 0, "time": t0, "status": "running"}]
    for step in range(steps):
        line = metrics_event(step, t0 + step, reward_offset)
        line["metrics"].update(extra_metrics(step) if extra_metrics else {})
        events += [line, samples_event(step, t0 + step)]
    store.ingest(run_id, events)
    if status != "running":
        store.set_status(run_id, status)
    return run_id


def add_arm_run(store: RunStore, run_id: str, arm: str, seed: int, events: list[dict], *, group: str, home: Path,
                owner: str = "erin") -> str:
    """A finished run of ``arm`` (also its preset) trained with ``seed`` in ``group``, its run
    directory under ``home``, with ``events`` ingested; returns its id."""
    store.create_run(run_id=run_id, name=arm, algorithm=arm, total_steps=len(events), target="local", launcher="local",
                     recipe_yaml=load_recipe(arm, [f"train.seed={seed}"]).to_yaml(), host="localhost",
                     created_by=owner, run_dir=str(home / "runs" / run_id), group=group, arm=arm)
    store.ingest(run_id, events)
    store.set_status(run_id, "finished")
    return run_id


def run_dir(run_id: str) -> Path:
    path = workbench_home() / "runs" / run_id
    path.mkdir(parents=True, exist_ok=True)
    return path


class LiveRun:
    """A running run: a real detached process (``sleep``) stands in for the trainer, and the test
    appends the trainer's event lines to its events.jsonl, which the collector ingests."""

    def __init__(self, store: RunStore, *, preset: str = "grpo", name: str | None = None, total: int = 1000,
                 group: str | None = None, owner: str = "alice") -> None:
        from workbench.runs.launchers.local import _start_time

        self.run_id = add_run(store, preset=preset, name=name, steps=0, total=total, status="running", group=group,
                              owner=owner)
        self.proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
        start = None
        while start is None:
            start = _start_time(self.proc.pid)
        store.update_run(self.run_id, handle={"pid": self.proc.pid, "pgid": self.proc.pid, "start_time": start})
        self.events = run_dir(self.run_id) / "events.jsonl"
        self.write({"kind": "status", "step": 0, "time": time.time(), "status": "running"})

    def write(self, *events: dict) -> None:
        with open(self.events, "a") as f:
            f.write("".join(json.dumps(e) + "\n" for e in events))

    def step(self, step: int) -> float:
        """Write step ``step``'s metrics and samples now; returns the event time."""
        t = time.time()
        self.write(metrics_event(step, t), samples_event(step, t))
        return t

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
