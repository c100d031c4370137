"""What an event line must look like (workbench.runs.ingest): pure checks, tested by class of bad
input; and the store writes exactly what they accept (real SQLite)."""

from __future__ import annotations

import json

import pytest

from workbench.runs import RunStore
from workbench.runs.ingest import KINDS, Event, Ignored, Rejected, check_event
from workbench.runs.store import WRITERS

NOW = 50.0
GOOD = {
    "status": {"status": "running"},
    "error": {"error": "boom"},
    "metrics": {"metrics": {"reward": 0.5}},
    "samples": {"samples": [{"completion": "2", "reward": 1.0}]},
    "diagnostics": {"ratio": [1.0, 0.9]},
    "lens": {"cosine": 1.0},
    "resume": {"warnings": ["checkpoint skipped", 7]},
}
NON_FINITE = [float("nan"), float("inf"), -float("inf"), 2**63, -(2**63) - 1, 12345678901234567890123]
WRONG_STEPS = [None, True, False, -1, 1.5, "3", [1], {"a": 1}]
WRONG_TIMES = [None, "noon", True, [1.0], {"t": 1}]
NOT_OBJECTS = [[1, 2], "text", 7, None, 1.5, True]
WRONG_PAYLOADS = [("metrics", {"metrics": [1]}), ("metrics", {"metrics": "x"}), ("samples", {"samples": "abc"}),
                  ("samples", {"samples": [1, 2]}), ("samples", {"samples": {"a": 1}})]
UNKNOWN_STATUSES = ["paused", None, "", "RUNNING", 3, ["running"]]


def _event(kind, **extra):
    return {"kind": kind, "step": 2, "time": 10.0, **GOOD[kind], **extra}


def test_every_kind_is_checked_and_written():
    assert set(KINDS) == set(GOOD) == set(WRITERS)
    for kind in KINDS:
        checked = check_event(_event(kind), NOW)
        assert isinstance(checked, Event) and (checked.kind, checked.step, checked.time) == (kind, 2, 10.0), kind


def test_payloads_are_normalised():
    assert check_event(_event("status", error=ValueError("x")), NOW).payload == {"status": "running", "error": "x"}
    assert check_event(_event("resume"), NOW).payload == {"warnings": ["checkpoint skipped"]}
    assert check_event({"kind": "metrics", "step": 0}, NOW) == Event("metrics", 0, NOW, {"metrics": {}})  # time: now


@pytest.mark.parametrize("kind", sorted(GOOD))
@pytest.mark.parametrize("number", NON_FINITE, ids=repr)
def test_a_number_no_store_can_hold_is_refused_anywhere_in_any_kind(kind, number):
    for where in ({"extra": number}, {"nested": [{"deep": [number]}]}, {"time": number}, {"step": number}):
        checked = check_event({**_event(kind), **where}, NOW)
        assert isinstance(checked, Rejected) and "out of range or not finite" in checked.reason, (where, checked)


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_wrong_step_or_time_types_are_refused(kind):
    for step in WRONG_STEPS:
        assert isinstance(check_event(_event(kind, step=step), NOW), Rejected), step
    for when in WRONG_TIMES:
        assert isinstance(check_event(_event(kind, time=when), NOW), Rejected), when


def test_what_is_not_an_object_is_refused():
    # lines that are not JSON never reach check_event: the launchers' one decoder
    # (launchers.base.parse_events) counts them as unreadable (tests/runs/test_integrity_events.py)
    for raw in NOT_OBJECTS:
        assert check_event(raw, NOW) == Rejected(f"not a JSON object: {repr(raw)[:100]}")


def test_payloads_of_the_wrong_type_and_kinds_that_are_not_strings_are_refused():
    for kind, payload in WRONG_PAYLOADS:
        assert isinstance(check_event({"kind": kind, "step": 1, **payload}, NOW), Rejected), payload
    for kind in (None, 3, ["metrics"], {"k": 1}):
        assert isinstance(check_event({"kind": kind, "step": 1}, NOW), Rejected), kind
    assert isinstance(check_event({"step": 1}, NOW), Rejected)  # no kind at all


@pytest.mark.parametrize("status", UNKNOWN_STATUSES, ids=repr)
def test_unknown_statuses_are_refused(status):
    assert check_event({"kind": "status", "step": 0, "status": status}, NOW) == Rejected(f"status={status!r}")


def test_kinds_of_a_newer_engine_are_ignored_not_refused():
    assert check_event({"kind": "telemetry", "step": 0, "x": 1}, NOW) == Ignored("telemetry")


def test_the_store_counts_every_refused_event_and_writes_none_of_them(tmp_path):
    store = RunStore(tmp_path / "runs.db")
    store.create_run(run_id="r1", name="r", algorithm="grpo", recipe_yaml="name: r\n", total_steps=3, target="local",
                     launcher="local", host="localhost", created_by="t", run_dir="/x")
    bad = ([{**_event("metrics"), "extra": n} for n in NON_FINITE] + [_event("metrics", step=s) for s in WRONG_STEPS]
           + NOT_OBJECTS + [{"kind": k, "step": 1, **p} for k, p in WRONG_PAYLOADS]
           + [{"kind": "status", "step": 0, "status": s} for s in UNKNOWN_STATUSES])
    assert store.ingest("r1", [*bad, {"kind": "telemetry", "step": 0}, _event("metrics")]) == 1
    run = store.get_run("r1")
    assert (run.skipped_events, run.status, run.last_step) == (len(bad), "queued", 2)
    assert store.metrics(["r1"]).step.tolist() == [2]
