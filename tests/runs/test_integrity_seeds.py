"""Seeds are unique per arm: the store's constraint, three CLI launches at once, an older file that
already holds duplicates, and the verdict refusing to count a copy as a replicate (issue 17)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest
import sqlalchemy as sa

from tests.runs.test_arms import _synthetic_group, full_queue  # noqa: F401  (fixture)
from tests.test_cli import REPO, assert_one_line_error, cli, leftovers
from workbench.analysis.stats import DuplicateSeedError, final_window_scores
from workbench.runs import RunError, RunStore
from workbench.runs.database import engine_for
from workbench.runs.store import UNIQUE_SEED_INDEX


def _row(run_id: str, seed: int, group: str | None = "g", arm: str = "grpo") -> dict:
    return dict(run_id=run_id, name="grpo", algorithm="grpo", recipe_yaml=f"name: grpo\ntrain:\n  seed: {seed}\n",
                total_steps=3, target="local", launcher="local", host="localhost", created_by="t", run_dir="/x",
                group=group, arm=arm)


def test_the_store_refuses_a_second_run_with_the_same_group_arm_and_seed(store):
    store.create_runs([_row("a0", 0), _row("a1", 1)])
    with pytest.raises(RunError, match=r"group 'g' already has arm 'grpo' with seed 1"):
        store.create_runs([_row("b2", 2), _row("b1", 1)])  # all or nothing: b2 is not kept either
    assert sorted(r["id"] for r in store.runs()) == ["a0", "a1"]
    store.create_runs([_row("c1", 1, group="other"), _row("d1", 1, arm="rloo"), _row("e1", 1, group=None),
                       _row("f1", 1, group=None)])  # another group, another arm, or no group at all: allowed
    with engine_for(store.url).begin() as db, pytest.raises(sa.exc.IntegrityError):  # the database itself holds the rule
        db.execute(sa.text("UPDATE runs SET seed = 0 WHERE id = 'a1'"))


def test_the_check_is_given_the_groups_arms_with_their_seeds(store):
    store.create_runs([_row("a0", 0)])
    seen = []
    store.create_runs([_row("a1", 1)], check=lambda arms: seen.append({g: {a: [r["seed"] for r in rs] for a, rs in
                                                                              by_arm.items()} for g, by_arm in arms.items()}))
    assert seen == [{"g": {"grpo": [0]}}]


def test_three_concurrent_cli_launches_claim_each_seed_once(full_queue, tmp_path):  # noqa: F811
    """Three `launch grpo --seeds 3 --group g` at once used to give seeds 0,0,1,1,2,2 in one arm
    (a read-then-insert check). Now one launch gets seeds 0-2; the others get one line, exit 2,
    and leave no row and no run directory."""
    env = {**os.environ, "WORKBENCH_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "workbench", "launch", "grpo", "--seeds", "3", "--group", "g", "--set", "train.steps=10"]
    procs = [subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    won = [r for r in results if r[0] == 0]
    lost = [r for r in results if r[0] != 0]
    assert len(won) == 1 and len(lost) == 2, results
    for code, out, err in lost:
        assert_one_line_error(subprocess.CompletedProcess(argv, code, out, err), "group 'g' already has arm 'grpo'",
                              "seed", "not a replicate")
    arms = full_queue.arms("g")
    assert {arm: [r["seed"] for r in runs] for arm, runs in arms.items()} == {"grpo": [0, 1, 2]}
    assert sorted(won[0][1].split()) == sorted(r["id"] for r in arms["grpo"])
    assert sorted(leftovers(tmp_path)) == sorted(["blocker", *won[0][1].split(), *won[0][1].split()])  # dirs + rows


def _store_with_duplicates(path):
    """A store file as an older version left it after racing launches: no unique index, and arm
    'grpo' of group 'g' holding seed 0 twice (rows inserted directly)."""
    store = RunStore(path)
    _synthetic_group(store)
    with sqlite3.connect(path) as db:
        db.execute(f"DROP INDEX {UNIQUE_SEED_INDEX}")
        db.execute("PRAGMA user_version = 1")
        db.execute("INSERT INTO runs (id, name, algorithm, status, target, launcher, host, created_by, created_at, grp,"
                   " recipe, run_dir, total_steps, arm, seed) SELECT 'grpo-copy', name, algorithm, status, target, launcher,"
                   " host, created_by, created_at + 1, grp, recipe, run_dir, total_steps, arm, seed FROM runs"
                   " WHERE id = 'grpo-s0'")
        db.execute("INSERT INTO metrics SELECT 'grpo-copy', step, time, data FROM metrics WHERE run_id = 'grpo-s0'")


def test_an_older_file_with_duplicate_seeds_stays_usable_and_the_verdict_refuses_it(tmp_path):
    path = tmp_path / "runs.db"
    _store_with_duplicates(path)
    store = RunStore(path)  # the index cannot be made: the file opens anyway
    assert [d["ids"] for d in store.duplicate_seeds()] == [["grpo-s0", "grpo-copy"]]
    listed = cli(tmp_path, "runs", "list")  # named before `compare` refuses the group
    assert listed.returncode == 0 and "grpo-copy" in listed.stdout, listed.stderr
    warning = [line for line in listed.stderr.splitlines() if "seed" in line]
    assert len(warning) == 1 and warning[0].startswith("warning: 1 seed(s)") and "group 'g' arm 'grpo' seed 0: grpo-s0, grpo-copy" in warning[0], listed.stderr
    assert len(store.arms("g")["grpo"]) == 4
    frame = store.arm_metrics([r["id"] for runs in store.arms("g").values() for r in runs])
    with pytest.raises(DuplicateSeedError, match=r"arm 'grpo' seed 0: runs grpo-s0, grpo-copy"):
        final_window_scores(frame, "reward", 0.2)
    res = cli(tmp_path, "compare", "g", "--window", "0.2")
    assert_one_line_error(res, "arm 'grpo' seed 0", "grpo-s0", "grpo-copy", "not an independent replicate")
    with pytest.raises(RunError, match="already has arm 'grpo' with seed"):  # no new copy joins it
        store.create_runs([_row("another", 0)])

    store.delete("grpo-copy")
    RunStore(path)  # gone: the next open makes the index
    assert "seed" not in cli(tmp_path, "runs", "list").stderr
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT name FROM sqlite_master WHERE name = ?", (UNIQUE_SEED_INDEX,)).fetchone()
    assert cli(tmp_path, "compare", "g", "--window", "0.2").stdout.splitlines()[2].split()[:2] == ["grpo", "3"]
