"""Ingest benchmark: how soon a step's event is queryable, and how fast the store swallows events.

    python bench/ingest_bench.py [--runs 8] [--seconds 10] [--rate 10] [--interval 0.25]

1. Latency: ``--runs`` fake live runs (their handle points at this process, so the local launcher
   sees them alive) append metrics events at ``--rate`` steps/s each; the app's background
   collector (``ensure_collector``) ingests them; a reader polls the store. Latency = first time a
   (run, step) is queryable - the event's own time. Target: median < 0.5 s.
2. Throughput: the same runs with 2,000 events each already written; one ``sync`` ingests them.
   Baseline printed beside it: writing the same rows with one INSERT per row and a commit per row
   (the naive way), so the ratio says what batching per run buys.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _fake_run(store, home: Path, i: int) -> str:
    from workbench.runs.launchers.local import _start_time

    run_id = f"bench-{i}"
    run_dir = home / "runs" / run_id
    run_dir.mkdir(parents=True)
    store.create_run(run_id=run_id, name=run_id, algorithm="grpo", recipe_yaml="name: grpo\n", total_steps=10**6,
                     target="local", launcher="local", host="localhost", created_by="bench", run_dir=str(run_dir))
    pid = os.getpid()
    store.update_run(run_id, handle={"pid": pid, "pgid": pid, "start_time": _start_time(pid)})
    store.set_status(run_id, "running")
    return run_id


def _event(step: int) -> str:
    metrics = {"reward": 0.5, "reward_std": 0.1, "kl": 0.01, "entropy": 1.2, "loss/policy": 0.1, "grad_norm": 0.3,
               **{f"extra/{k}": float(k) for k in range(30)}}
    return json.dumps({"kind": "metrics", "step": step, "time": time.time(), "metrics": metrics}) + "\n"


def latency(n_runs: int, seconds: float, rate: float, interval: float) -> list[float]:
    from workbench.runs import RunStore
    from workbench.runs.service import ensure_collector

    home = Path(tempfile.mkdtemp(prefix="wb-ingest-"))
    os.environ["WORKBENCH_HOME"] = str(home)
    store = RunStore()
    ids = [_fake_run(store, home, i) for i in range(n_runs)]
    written: dict[tuple[str, int], float] = {}
    stop = threading.Event()

    def writer(run_id: str) -> None:
        with open(home / "runs" / run_id / "events.jsonl", "a") as f:
            step = 0
            while not stop.is_set():
                written[(run_id, step)] = time.time()
                f.write(_event(step))
                f.flush()
                step += 1
                time.sleep(1.0 / rate)

    ensure_collector(store, interval_s=interval)
    threads = [threading.Thread(target=writer, args=(r,), daemon=True) for r in ids]
    for t in threads:
        t.start()
    seen: dict[tuple[str, int], float] = {}
    db = sqlite3.connect(store.path)
    end = time.time() + seconds
    while time.time() < end:
        for run_id, step in db.execute("SELECT run_id, step FROM metrics"):
            seen.setdefault((run_id, step), time.time())
        time.sleep(0.01)
    stop.set()
    return [seen[k] - written[k] for k in seen if k in written]


def throughput(n_runs: int, events_per_run: int = 2000) -> tuple[float, float]:
    from workbench.runs import RunStore, sync

    home = Path(tempfile.mkdtemp(prefix="wb-ingest-tp-"))
    os.environ["WORKBENCH_HOME"] = str(home)
    store = RunStore()
    ids = [_fake_run(store, home, i) for i in range(n_runs)]
    for run_id in ids:
        (home / "runs" / run_id / "events.jsonl").write_text("".join(_event(s) for s in range(events_per_run)))
    t0 = time.perf_counter()
    rows = sync(store)
    batched = time.perf_counter() - t0
    assert rows == n_runs * events_per_run, rows
    # naive baseline: one transaction per row
    naive_db = sqlite3.connect(home / "naive.db", isolation_level=None)
    naive_db.execute("PRAGMA journal_mode=WAL")
    naive_db.execute("CREATE TABLE metrics (run_id TEXT, step INTEGER, time REAL, data TEXT, PRIMARY KEY (run_id, step))")
    t0 = time.perf_counter()
    for run_id in ids:
        for line in (home / "runs" / run_id / "events.jsonl").read_text().splitlines():
            e = json.loads(line)
            naive_db.execute("BEGIN IMMEDIATE")
            naive_db.execute("INSERT OR IGNORE INTO metrics VALUES (?,?,?,?)", (run_id, e["step"], e["time"], json.dumps(e["metrics"])))
            naive_db.execute("COMMIT")
    naive = time.perf_counter() - t0
    return n_runs * events_per_run / batched, n_runs * events_per_run / naive


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=10.0, help="steps per second per run")
    parser.add_argument("--interval", type=float, default=0.25, help="collector interval (s)")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds (min/median/max printed)")
    args = parser.parse_args()
    lat = sorted(latency(args.runs, args.seconds, args.rate, args.interval))
    p95 = lat[int(0.95 * (len(lat) - 1))]
    print(f"latency  event written -> queryable, {args.runs} live runs x {args.rate:g} steps/s, collector every {args.interval:g} s:")
    print(f"         n={len(lat)}  min={lat[0] * 1000:.0f} ms  median={statistics.median(lat) * 1000:.0f} ms  p95={p95 * 1000:.0f} ms  max={lat[-1] * 1000:.0f} ms"
          f"  (target median < 500 ms: {statistics.median(lat) / 0.5:.2f}x of target)")
    fast, naive = zip(*(throughput(args.runs) for _ in range(max(1, args.rounds))))
    ratios = [f / n for f, n in zip(fast, naive)]

    def mmm(xs, fmt):  # min / median / max
        return "/".join(format(x, fmt) for x in (min(xs), statistics.median(xs), max(xs)))

    print(f"ingest   {args.runs} runs x 2000 events in one sync, {len(fast)} rounds (min/median/max): {mmm(fast, ',.0f')} events/s;"
          f" naive row-per-transaction baseline {mmm(naive, ',.0f')} events/s; ratio {mmm(ratios, '.1f')}x")


if __name__ == "__main__":
    main()
