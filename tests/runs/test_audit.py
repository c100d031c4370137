"""The audit log (issue 21) on both backends: every authorised action of the service that succeeds
is one entry naming who (owner, role, how they signed in), when, what and from where; a refused
action is no entry; sign-ins are recorded by the UI through the service; only an admin reads the
log; the CLI prints and exports it. Launches go through the real local queue of a home whose only
slot is held (nothing trains)."""

from __future__ import annotations

import csv
import time

import pytest

from tests.runs.helpers import held_cpu_slot
from tests.test_cli import assert_one_line_error, cli
from workbench.recipe import load_recipe
from workbench.runs import (PermissionDenied, Principal, RunStore, Settings, cancel, delete, edit_run, launch,
                            launch_group, launch_planned, plan_runs, resume, update_settings)
from workbench.runs.records import AUDIT_ACTIONS, AuditEntry, RunError
from workbench.runs.service import audit_log, record_event, record_refused_sign_in

ALICE = Principal("alice", "member", "oidc", address="10.0.0.8")
BOB = Principal("bob", "member", "shared password", address="10.0.0.9")
VIEWER = Principal("vic", "viewer", "oidc", address="10.0.0.10")
ADMIN = Principal("root", "admin", "oidc", address="10.0.0.7")


@pytest.fixture
def queue_home(store_location, tmp_path, monkeypatch):
    """A home on each backend (WORKBENCH_DB for PostgreSQL) whose only CPU slot is held by a live
    ``sleep`` posing as a running local run: launches queue and nothing trains."""
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path))
    if isinstance(store_location, str):
        monkeypatch.setenv("WORKBENCH_DB", store_location)
    with held_cpu_slot(tmp_path, ADMIN) as store:
        yield store, tmp_path


def _entries(store) -> list[tuple]:
    """The log oldest first, as (actor, role, auth, action, target, address)."""
    return [(e.actor, e.role, e.auth, e.action, e.target, e.address) for e in reversed(store.audit_entries())]


def test_every_successful_action_is_one_entry_and_a_refused_one_none(queue_home):
    store, home = queue_home
    started = time.time()
    one = launch(load_recipe("grpo", ["train.steps=1"]), principal=ALICE, store=store)
    planned = launch_planned(plan_runs(["grpo", "rloo"], overrides=["train.steps=1"]), group="g", principal=ALICE,
                             store=store)
    grouped = launch_group(["grpo"], group="g2", seeds=2, principal=ALICE, store=store)  # one entry, not two
    edit_run(one, principal=ALICE, name="renamed", store=store)
    cancel(one, principal=ALICE, store=store)
    resume(one, principal=ADMIN, store=store)
    delete(one, principal=ADMIN, store=store)
    update_settings(Settings(cpu_slots=1, gpu_slots=0, reward_funcs_allowed=["mymod:f"]), principal=ADMIN)
    record_event(ALICE, "sign_in", detail="oidc issuer http://127.0.0.1:9")
    record_refused_sign_in("mallory", "shared password", "10.6.6.6", "wrong password")
    record_event(ALICE, "sign_out")
    before = _entries(store)
    # refused: PermissionDenied before anything happens, and no entry
    for refused in (lambda: cancel(planned[0], principal=BOB, store=store),
                    lambda: delete(planned[0], principal=VIEWER, store=store),
                    lambda: launch(load_recipe("grpo", ["train.steps=1"]), principal=VIEWER, store=store),
                    lambda: update_settings(Settings(cpu_slots=3), principal=ALICE)):
        with pytest.raises(PermissionDenied):
            refused()
    assert _entries(store) == before
    alice, root = ("alice", "member", "oidc"), ("root", "admin", "oidc")
    assert before == [
        (*alice, "launch", one, "10.0.0.8"),
        (*alice, "launch", ",".join(planned), "10.0.0.8"),
        (*alice, "launch", ",".join(grouped), "10.0.0.8"),
        (*alice, "edit", one, "10.0.0.8"),
        (*alice, "cancel", one, "10.0.0.8"),
        (*root, "resume", one, "10.0.0.7"),
        (*root, "cancel", one, "10.0.0.7"),  # delete cancels the resumed (queued) run first
        (*root, "delete", one, "10.0.0.7"),
        (*root, "settings", "settings", "10.0.0.7"),
        (*alice, "sign_in", "", "10.0.0.8"),
        ("mallory", "", "shared password", "sign_in_refused", "", "10.6.6.6"),
        (*alice, "sign_out", "", "10.0.0.8"),
    ]
    newest_first = store.audit_entries()
    assert all(started <= e.at <= time.time() for e in newest_first)
    assert [e.at for e in newest_first] == sorted((e.at for e in newest_first), reverse=True)
    detail = {(e.action, e.target): e.detail for e in newest_first}
    assert detail[("launch", ",".join(planned))] == "2 runs on local in group g: grpo (seeds 0); rloo (seeds 0)"
    assert detail[("launch", ",".join(grouped))] == "2 runs on local in group g2: grpo (seeds 0, 1)"
    assert detail[("edit", one)] == "name: 'grpo' -> 'renamed'"
    assert detail[("cancel", one)] in ("cancelled before it started", "cancel requested")
    assert detail[("resume", one)] == "from step 0 (no checkpoint)"
    assert detail[("settings", "settings")] == "changed: reward_funcs_allowed"
    assert detail[("sign_in_refused", "")] == "wrong password"


def test_only_an_admin_reads_the_log_with_its_filters(store):
    for i, (who, action) in enumerate([(ALICE, "launch"), (BOB, "launch"), (ALICE, "cancel"), (ADMIN, "settings")]):
        store.record_audit(AuditEntry(at=100.0 + i, actor=who.owner, role=who.role, auth=who.auth, action=action,
                                      target=f"t{i}", address=who.address))
    for who in (VIEWER, ALICE):
        with pytest.raises(PermissionDenied, match=rf"^permission denied: audit by {who.name} .*: needs role admin$"):
            audit_log(who, store=store)
    assert [e.target for e in audit_log(ADMIN, store=store)] == ["t3", "t2", "t1", "t0"]
    assert [e.target for e in audit_log(ADMIN, actor="alice", store=store)] == ["t2", "t0"]
    assert [e.target for e in audit_log(ADMIN, action="launch", store=store)] == ["t1", "t0"]
    assert [e.target for e in audit_log(ADMIN, since=102.0, store=store)] == ["t3", "t2"]
    assert [e.target for e in audit_log(ADMIN, limit=1, store=store)] == ["t3"]
    assert [e.target for e in audit_log(ADMIN, actor="bob (password)", store=store)] == ["t1"]  # the owner key
    with pytest.raises(RunError, match=r"limit=0 is not allowed; a whole number from 1 to 100000"):
        audit_log(ADMIN, limit=0, store=store)
    with pytest.raises(RunError, match="action='hack' is not allowed; one of: launch, cancel"):
        audit_log(ADMIN, action="hack", store=store)


def test_an_entry_is_one_bounded_line_of_a_known_action(store):
    store.record_audit(AuditEntry(at=1.0, actor="ann", role="admin", auth="oidc", action="edit", target="r1",
                                  detail="notes:\n" + "x" * 5000, address="::1"))
    entry = store.audit_entries()[0]
    assert "\n" not in entry.detail and len(entry.detail) == 1000 and entry.detail.startswith("notes: xxx")
    with pytest.raises(RunError, match="action='drop_table' is not allowed"):
        store.record_audit(AuditEntry(at=1.0, actor="ann", role="admin", auth="oidc", action="drop_table", target=""))
    with pytest.raises(RunError, match="action='nope' is not allowed"):
        record_event(ALICE, "nope", store=store)
    assert len(store.audit_entries()) == 1 and set(AUDIT_ACTIONS) >= {"launch", "sign_in", "sign_in_refused", "import"}


def test_the_cli_prints_and_exports_the_log(tmp_path):
    """`runs audit --csv FILE` writes every column (the CLI's user is an admin of its store); a
    FILE that cannot be written is one line, exit 2."""
    store = RunStore(tmp_path / "runs.db")
    store.record_audit(AuditEntry(at=0.0, actor="alice", role="member", auth="oidc", action="launch", target="r1,r2",
                                  detail="2 runs, \"quoted\"", address="10.0.0.8"))
    store.record_audit(AuditEntry(at=60.0, actor="root", role="admin", auth="oidc", action="delete", target="r1"))
    res = cli(tmp_path, "runs", "audit", "--csv", str(tmp_path / "audit.csv"))
    assert res.returncode == 0 and res.stdout == "2 entries written to " + str(tmp_path / "audit.csv") + "\n", res.stderr
    with open(tmp_path / "audit.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows == [
        {"at": "1970-01-01T00:01:00Z", "actor": "root", "role": "admin", "auth": "oidc", "action": "delete",
         "target": "r1", "detail": "", "address": ""},
        {"at": "1970-01-01T00:00:00Z", "actor": "alice", "role": "member", "auth": "oidc", "action": "launch",
         "target": "r1,r2", "detail": "2 runs, \"quoted\"", "address": "10.0.0.8"}]
    bad = cli(tmp_path, "runs", "audit", "--csv", str(tmp_path / "no" / "such" / "dir.csv"))
    assert_one_line_error(bad, "--csv=", "cannot be written")
