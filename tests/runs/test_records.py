"""The typed records of the run layer: every column of a runs row comes back as a typed Run
field (a real SQLite file and a real PostgreSQL database), and the store implements the RunRepository interface the service uses."""

from __future__ import annotations

import dataclasses
import pytest
import sqlalchemy as sa

from workbench.runs import Run, RunRepository, RunStore
from workbench.runs.database import engine_for
from workbench.runs.records import RUN_FIELDS


def _full_run(store: RunStore) -> Run:
    """A run with every column set to a value that is not its default."""
    store.create_run(run_id="r1", name="my run", algorithm="grpo", recipe_yaml="name: grpo\ntrain:\n  seed: 7\n",
                     total_steps=9, target="ssh://gpu1", launcher="ssh", host="gpu1", created_by="ann",
                     run_dir="/tmp/r1", group="g", tags=["b", "a"], notes="why", launch={"num_processes": 2},
                     arm="grpo · eps_high=0.3", sweep={"algorithm.eps_high": 0.3})
    store.update_run("r1", handle={"pid": 5}, events_offset=120, events_inode="1:2", cancel_requested=1, error="e",
                     skipped_events=3, warnings=["w"], started_at=11.0, ended_at=12.0, last_step=4, reward=0.5,
                     status="failed")
    return store.get_run("r1")


def test_every_column_round_trips_as_a_typed_field(store):
    run = _full_run(store)
    assert isinstance(run, Run)
    with engine_for(store.url).connect() as conn:
        columns = {c["name"] for c in sa.inspect(conn).get_columns("runs")}
    assert {("grp" if f == "group" else f) for f in RUN_FIELDS} == columns  # one field per column, no more
    expected = dict(id="r1", name="my run", algorithm="grpo", status="failed", target="ssh://gpu1", launcher="ssh",
                    host="gpu1", created_by="ann", recipe="name: grpo\ntrain:\n  seed: 7\n", run_dir="/tmp/r1",
                    total_steps=9, started_at=11.0, ended_at=12.0, group="g", tags=["b", "a"], notes="why",
                    launch={"num_processes": 2}, handle={"pid": 5}, events_offset=120, events_inode="1:2", last_step=4,
                    reward=0.5, error="e", cancel_requested=True, skipped_events=3, warnings=["w"],
                    arm="grpo · eps_high=0.3", seed=7, sweep={"algorithm.eps_high": 0.3}, metrics_generation=0)
    got = run.to_dict()
    assert set(got) == set(expected) | {"created_at"} and isinstance(run.created_at, float)
    assert {k: got[k] for k in expected} == expected
    assert run.num_processes == 2 and run.terminal and not run.active
    assert store.runs() == [run] and store.arms("g") == {"grpo · eps_high=0.3": [run]}


def test_a_run_is_read_only_and_its_containers_are_copies(store):
    run = _full_run(store)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.status = "running"
    run.tags.append("z")
    run.launch["gpus"] = [0]
    again = store.get_run("r1")
    assert (again.tags, again.launch) == (["b", "a"], {"num_processes": 2})
    # the read-only mapping access kept for the transition (launchers read runs as mappings)
    assert run["status"] == "failed" and run.get("handle") == {"pid": 5} and {**again}["id"] == "r1"
    with pytest.raises(KeyError):
        run["grp"]


def test_the_sqlite_store_implements_the_repository_interface(tmp_path):
    store = RunStore(tmp_path / "runs.db")
    assert isinstance(store, RunRepository)
    assert store.identity == str(tmp_path / "runs.db") and store.is_open()


def test_the_postgres_store_implements_the_repository_interface(postgres_url):
    """Its identity (the key of per-store caches and log lines) is the URL without the password."""
    store = RunStore(postgres_url.replace("://workbench@", "://workbench:s3cret@"))
    assert isinstance(store, RunRepository) and store.is_open() and store.path is None
    assert store.identity == postgres_url.replace("://workbench@", "://workbench:***@")
