"""The run store on both backends (a real SQLite file; a real PostgreSQL database, see
tests/runs/postgres.py): idempotent ingest, status rules, concurrent writers, queries."""

import json
import multiprocessing as mp
import sqlite3

import pytest

from workbench.runs import RunError, RunStore


def _make(store, run_id="r1", **kw):
    args = dict(run_id=run_id, name="grpo", algorithm="grpo", recipe_yaml="name: grpo\n", total_steps=10,
                target="local", launcher="local", host="localhost", created_by="ann", run_dir="/tmp/x")
    args.update(kw)
    return store.create_run(**args)


def _metrics(step, reward):
    return {"kind": "metrics", "step": step, "time": 100.0 + step, "metrics": {"reward": reward, "kl": 0.0}}


def test_sqlite_file_is_wal(tmp_path):
    """SQLite only: the journal mode is the file's (readers beside one writer)."""
    _make(RunStore(tmp_path / "runs.db"))
    mode = sqlite3.connect(tmp_path / "runs.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_run_round_trips(store):
    _make(store, tags=["a", "b"], group="g1", notes="n")
    run = store.get_run("r1")
    assert (run["status"], run["tags"], run["group"], run["notes"], run["last_step"]) == ("queued", ["a", "b"], "g1", "n", -1)
    frame = store.list_runs(group="g1")
    assert list(frame.id) == ["r1"] and frame.loc[0, "created_by"] == "ann"
    assert store.list_runs(tag="zzz").empty


def test_the_runs_frame_is_the_records_as_a_frame_with_seed_as_nullable_integers(store):
    """``list_runs``' frame is pandas' frame of the records' fields (one dict per run) with ``seed``
    as Int64, whatever the runs hold: a known and an unknown seed, a run never started (None times),
    a finished one, no run at all."""
    import pandas as pd

    from workbench.runs.store import RUN_COLUMNS, runs_frame

    _make(store, "r1", tags=["a"], group="g")
    _make(store, "r2", recipe_yaml="name: grpo\ntrain:\n  seed: 3\n")
    store.ingest("r2", [{"kind": "status", "step": 0, "time": 100.0, "status": "running"}, _metrics(0, 0.5),
                        {"kind": "status", "step": 1, "time": 101.0, "status": "finished"}])
    store.update_run("r1", seed=None)
    records = store.runs()
    for rows in (records, records[:1], records[1:], []):
        expected = pd.DataFrame([{c: getattr(r, c) for c in RUN_COLUMNS} for r in rows], columns=RUN_COLUMNS)
        pd.testing.assert_frame_equal(runs_frame(rows), expected.astype({"seed": "Int64"}))
    assert runs_frame(records)["seed"].isna().tolist() == [True, False]


def test_ingest_is_idempotent_by_run_step_kind(store):
    _make(store)
    events = [_metrics(0, 0.25), _metrics(1, 0.5),
              {"kind": "samples", "step": 1, "time": 1.0, "samples": [{"prompt": "1+1=", "completion": "2", "reward": 1.0,
                                                                       "advantage": 0.5, "length": 1, "truncated": False}]}]
    assert store.ingest("r1", events) == 3
    assert store.ingest("r1", events) == 0  # replay adds nothing
    frame = store.metrics(["r1"])
    assert frame.step.tolist() == [0, 1] and frame.reward.tolist() == [0.25, 0.5]
    assert frame.time.tolist() == [100.0, 101.0]
    run = store.get_run("r1")
    assert (run["last_step"], run["reward"]) == (1, 0.5)
    samples = store.samples("r1")
    assert samples.completion.tolist() == ["2"] and samples.advantage.tolist() == [0.5]


def test_offset_compare_and_set_rejects_a_stale_reader(store):
    _make(store)
    assert store.ingest("r1", [_metrics(0, 0.1)], offset=(0, 50)) == 1
    # a second collector that read the same bytes from offset 0 loses the race: nothing applied
    assert store.ingest("r1", [_metrics(0, 0.1), _metrics(1, 0.2)], offset=(0, 100)) == 0
    assert store.get_run("r1")["events_offset"] == 50
    assert store.metrics(["r1"]).step.tolist() == [0]


def test_status_only_moves_forward(store):
    _make(store)
    status = lambda s, **kw: {"kind": "status", "step": 0, "time": 5.0, "status": s, **kw}  # noqa: E731
    store.ingest("r1", [status("starting"), status("running"), status("failed", error="ValueError: boom")])
    store.ingest("r1", [status("running")])  # a replayed older line
    run = store.get_run("r1")
    assert (run["status"], run["error"], run["ended_at"]) == ("failed", "ValueError: boom", 5.0)
    _make(store, run_id="r2")
    store.set_status("r2", "lost", error="gone")
    store.ingest("r2", [status("finished")])  # every terminal status is final, 'lost' too
    assert store.get_run("r2")["status"] == "lost"
    with pytest.raises(RunError, match="status='weird' is not allowed"):
        store.set_status("r2", "weird")


def test_diagnostics_and_lens_rows(store):
    _make(store)
    diag = {"kind": "diagnostics", "step": 2, "time": 1.0, "ratio": [[1.0, 1.2]], "region": [[0, 1]], "region_names": ["trust"]}
    lens = {"kind": "lens", "step": 2, "time": 1.0, "cosine": {"grpo": 1.0}}  # what the engine writes
    assert store.ingest("r1", [diag, lens]) == 2
    assert store.diagnostic_steps("r1") == [2]
    assert store.diagnostics("r1", 2)["ratio"] == [[1.0, 1.2]]
    assert store.lens("r1") == [{"step": 2, "cosine": {"grpo": 1.0}}]
    with pytest.raises(RunError, match=r"no diagnostics at step=3; steps with diagnostics: \[2\]"):
        store.diagnostics("r1", 3)


def test_sample_steps_list_the_steps_and_samples_read_one_step(store):
    """The Compare page lists a run's sample steps, then reads only the chosen step's samples."""
    _make(store)
    sample = {"prompt": "1+1=", "completion": "2", "reward": 1.0, "advantage": 0.5, "length": 1, "truncated": False}
    store.ingest("r1", [{"kind": "samples", "step": s, "time": 1.0, "samples": [{**sample, "completion": str(s)}] * 2}
                        for s in (5, 1, 3)])
    assert store.sample_steps("r1") == [1, 3, 5] and store.sample_steps("r2") == []
    three = store.samples("r1", 3)
    assert three.step.tolist() == [3, 3] and three.completion.tolist() == ["3", "3"]


def test_unknown_run_and_delete(store):
    with pytest.raises(RunError, match="run id='nope' does not exist"):
        store.get_run("nope")
    _make(store)
    store.ingest("r1", [_metrics(0, 1.0)])
    store.delete("r1")
    assert store.list_runs().empty and store.metrics(["r1"]).empty


def test_rename_and_tags_are_validated(store):
    _make(store)
    store.rename("r1", "grpo-lr3e-4")
    store.set_tags("r1", ["baseline", "cpu"])
    assert (store.get_run("r1")["name"], store.get_run("r1")["tags"]) == ("grpo-lr3e-4", ["baseline", "cpu"])
    for bad in ("../etc", "a;rm -rf ~", "$(id)", "", "x" * 65):
        with pytest.raises(ValueError, match="tag=.* is not allowed"):
            store.set_tags("r1", [bad])
    for bad in ("../etc", "a\\b", "a\nb", "", "x" * 65):  # a name is a label: no path separators or control characters
        with pytest.raises(ValueError, match="name=.*(is not allowed|1-64 characters)"):
            store.rename("r1", bad)
    assert store.get_run("r1")["name"] == "grpo-lr3e-4"
    store.rename("r1", "grpo lr=3e-4; été")  # spaces, punctuation and accents are fine in a label
    assert store.get_run("r1")["name"] == "grpo lr=3e-4; été"


def _writer(location, run_id, steps):
    store = RunStore(location)
    for step in range(steps):
        store.ingest(run_id, [_metrics(step, step / steps)])


def test_concurrent_writer_processes(store_location):
    """Eight processes ingest into one store at once: every row lands, none twice, no 'database is locked'."""
    path = store_location
    store = RunStore(path)
    ids = [f"run{i}" for i in range(8)]
    for run_id in ids:
        _make(store, run_id=run_id)
    procs = [mp.get_context("spawn").Process(target=_writer, args=(path, run_id, 40)) for run_id in ids]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 8
    frame = store.metrics(ids)
    assert len(frame) == 8 * 40 and not frame.duplicated(["run_id", "step"]).any()
    assert json.loads(json.dumps(store.get_run("run3")["last_step"])) == 39


def test_malformed_events_are_skipped_counted_and_the_stream_goes_on(store, tmp_path):
    """Bad lines between good ones (a JSON value that is not an object, step None, payloads of the
    wrong type) are skipped and counted; the good ones land and the offset moves past all of them."""
    from workbench.runs.launchers import read_file_events

    _make(store)
    lines = [_metrics(0, 0.25), [1, 2], "text", 7, None, {"kind": "metrics", "step": None, "metrics": {"reward": 1.0}},
             {"kind": "metrics", "step": 1, "time": "noon", "metrics": {}}, {"kind": "metrics", "step": 1, "metrics": [1]},
             {"kind": "samples", "step": 1, "samples": "abc"}, {"kind": "metrics", "step": True, "metrics": {}},
             _metrics(1, 0.5), {"kind": "status", "step": 1, "time": 9.0, "status": "finished"}]
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    chunk = read_file_events(path, 0)
    assert chunk.offset == path.stat().st_size and len(chunk.events) == 12
    assert store.ingest("r1", chunk.events, offset=(0, chunk.offset)) == 3  # two metrics rows + the status change
    run = store.get_run("r1")
    assert (run["events_offset"], run["skipped_events"], run["status"], run["last_step"], run["reward"]) == (
        chunk.offset, 9, "finished", 1, 0.5)
    assert store.metrics(["r1"]).step.tolist() == [0, 1]


def test_reward_that_is_not_a_number_is_kept_in_metrics_but_not_as_the_runs_reward(store):
    _make(store)
    assert store.ingest("r1", [{"kind": "metrics", "step": 0, "time": 1.0, "metrics": {"reward": "high"}}]) == 1
    assert store.get_run("r1")["reward"] is None and store.metrics(["r1"]).reward.tolist() == ["high"]


def test_unknown_status_is_ignored_and_the_run_goes_on(store):
    _make(store)
    status = lambda s: {"kind": "status", "step": 0, "time": 5.0, "status": s}  # noqa: E731
    store.ingest("r1", [status("running"), status("paused"), status(None)])
    assert (store.get_run("r1")["status"], store.get_run("r1")["skipped_events"]) == ("running", 2)
    store.ingest("r1", [status("finished")])
    assert store.get_run("r1")["status"] == "finished"


def test_update_run_checks_fields_and_existence(store):
    _make(store)
    store.update_run("r1", group="g2", handle={"pid": 1})
    assert (store.get_run("r1")["group"], store.get_run("r1")["handle"]) == ("g2", {"pid": 1})
    with pytest.raises(RunError, match=r"run fields \['status; DROP TABLE runs'\] cannot be set"):
        store.update_run("r1", **{"status; DROP TABLE runs": "x"})
    with pytest.raises(RunError, match=r"run fields \['id'\] cannot be set"):
        store.update_run("r1", id="r2")
    with pytest.raises(RunError, match="run id='nope' does not exist"):
        store.update_run("nope", notes="x")


# The runs table of the oldest store files (before skipped_events, warnings, arm, seed, sweep).
OLDEST_RUNS_TABLE = (
    "CREATE TABLE runs (id TEXT PRIMARY KEY, name TEXT NOT NULL, algorithm TEXT NOT NULL, status TEXT NOT NULL,"
    " target TEXT NOT NULL, launcher TEXT NOT NULL, host TEXT NOT NULL, created_by TEXT NOT NULL,"
    " created_at REAL NOT NULL, started_at REAL, ended_at REAL, grp TEXT, tags TEXT NOT NULL DEFAULT '[]',"
    " notes TEXT NOT NULL DEFAULT '', recipe TEXT NOT NULL, run_dir TEXT NOT NULL, launch TEXT NOT NULL DEFAULT '{}',"
    " handle TEXT NOT NULL DEFAULT '{}', events_offset INTEGER NOT NULL DEFAULT 0,"
    " last_step INTEGER NOT NULL DEFAULT -1, total_steps INTEGER NOT NULL, reward REAL, error TEXT,"
    " cancel_requested INTEGER NOT NULL DEFAULT 0)")


def test_store_file_of_an_older_version_gains_the_new_column(tmp_path):
    """SQLite only: files this old exist only as SQLite files (PostgreSQL came with migrations)."""
    path = tmp_path / "runs.db"
    db = sqlite3.connect(path)
    db.execute(OLDEST_RUNS_TABLE)
    db.commit()
    db.close()
    store = RunStore(path)
    _make(store)
    store.ingest("r1", [[1]])
    assert store.get_run("r1")["skipped_events"] == 1


def test_queue_claim_and_cancel_are_compare_and_set(store):
    _make(store)
    assert store.claim_queued("r1") and not store.claim_queued("r1")  # exactly one claimer wins
    assert not store.cancel_queued("r1")  # claimed: cancel must go through the launcher
    assert store.get_run("r1")["status"] == "starting"
    _make(store, run_id="r2")
    assert store.cancel_queued("r2") and not store.claim_queued("r2")
    run = store.get_run("r2")
    assert (run["status"], run["cancel_requested"], run["error"]) == ("cancelled", 1, "cancelled before it started")
    _make(store, run_id="r3")
    store.update_run("r3", cancel_requested=1)
    assert not store.claim_queued("r3")  # a cancel in progress is never started


def test_arm_metrics_reads_every_runs_arm_and_seed_in_one_query_in_the_ids_order(store):
    """``run_arms`` / ``runs_by_id`` (one query for the arms view, was a ``get_run`` per run): the
    ids' order kept, each run's own arm and seed (from its recipe), the same records ``get_run``
    gives, and an unknown id refused by name as ``get_run`` refuses it."""
    _make(store, "r1", group="g", arm="a", recipe_yaml="name: grpo\ntrain:\n  seed: 7\n", sweep={"lr": 1})
    _make(store, "r2", group="g", arm="b", recipe_yaml="name: grpo\ntrain:\n  seed: 3\n", sweep={"lr": 2})
    store.ingest("r1", [_metrics(0, 0.5), _metrics(1, 0.75)])
    store.ingest("r2", [_metrics(0, 0.25)])
    assert store.run_arms(["r2", "r1"]).values.tolist() == [["r2", "b", 3], ["r1", "a", 7]]
    assert store.runs_by_id(["r2", "r1"]) == [store.get_run("r2"), store.get_run("r1")]
    frame = store.arm_metrics(["r2", "r1"])
    assert frame[["run_id", "arm", "seed", "step", "reward"]].values.tolist() == [
        ["r2", "b", 3, 0, 0.25], ["r1", "a", 7, 0, 0.5], ["r1", "a", 7, 1, 0.75]]
    for read in (store.run_arms, store.runs_by_id, store.arm_metrics):
        with pytest.raises(RunError, match=r"^run id='nope' does not exist; `python -m workbench runs list`"):
            read(["r1", "nope"])


def test_metrics_json_is_decoded_as_the_standard_library_decodes_it():
    """``decode_json_array`` (orjson, the standard library where orjson refuses the text): equal
    values for what ingest writes, and the text an older store may hold (``NaN``, ``Infinity``,
    an integer beyond 64 bits) still read, not an error (such an integer exactly where the standard
    library decodes the text, else as the nearest float)."""
    import math

    from workbench.runs.store import decode_json_array

    texts = [json.dumps({"reward": 0.1 + 0.2, "kl": 1e-300, "n": 2**62, "s": "ä\n", "l": [1, None]}), "{}"]
    assert decode_json_array(texts) == json.loads("[" + ",".join(texts) + "]")
    old = decode_json_array(['{"kl": NaN, "x": Infinity}', '{"n": 123456789012345678901234567890}'])
    assert math.isnan(old[0]["kl"]) and old[0]["x"] == math.inf and old[1]["n"] == 123456789012345678901234567890
    # without text orjson refuses beside it, orjson reads such an integer as the nearest float
    assert decode_json_array(['{"n": 123456789012345678901234567890}']) == [{"n": 1.2345678901234568e29}]
    assert decode_json_array([]) == []
