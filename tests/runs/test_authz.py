"""Every action of the run service is authorised below the UI (workbench.runs.authz): refused for
a viewer and for a member acting on someone else's run, with the store, the run directory and
the settings file unchanged; allowed for the run's owner and for an admin. Real SQLite; launches
go through the real local queue (its only slot held, so nothing trains)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runs.test_arms import full_queue  # noqa: F401  (a home whose CPU slot is held: launches queue)
from tests.test_cli import cli
from workbench.recipe import load_recipe
from workbench.runs import (PermissionDenied, Principal, RunStore, Settings, cancel, delete, edit_run, launch,
                            launch_group, launch_planned, load_settings, local_principal, plan_runs, resume,
                            update_settings)
from workbench.runs.settings import save_settings
from workbench.runs.authz import ACTIONS, RULES, refusal

ALICE = Principal("alice", "member", "test")  # owns the seeded runs
BOB = Principal("bob", "member", "test")
VIEWER = Principal("vic", "viewer", "test")
ADMIN = Principal("root", "admin", "test")


def _seed(store: RunStore, home: Path, run_id: str, status: str, owner: str = "alice") -> Path:
    """A run of ``owner`` in ``status`` with a run directory under the home (no process)."""
    run_dir = home / "runs" / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "recipe.yaml").write_text(load_recipe("grpo", ["train.steps=1"]).to_yaml())
    store.create_run(run_id=run_id, name=run_id, algorithm="grpo", recipe_yaml=load_recipe("grpo").to_yaml(),
                     total_steps=1, target="local", launcher="local", host="localhost", created_by=owner,
                     run_dir=str(run_dir))
    if status != "queued":
        store.set_status(run_id, status, error="boom" if status == "failed" else None)
    return run_dir


def _snapshot(store: RunStore) -> list[tuple]:
    return [(r.id, r.status, r.name, tuple(r.tags), r.notes, r.cancel_requested, r.created_by) for r in store.runs()]


# action -> (the call, the status the run is seeded in, what the allowed call leaves)
RUN_ACTIONS = {
    "cancel": (lambda store, rid, who: cancel(rid, principal=who, store=store, wait=False), "queued",
               lambda store, rid: store.get_run(rid).status == "cancelled"),
    "resume": (lambda store, rid, who: resume(rid, principal=who, store=store), "failed",
               lambda store, rid: store.get_run(rid).status == "queued"),  # the queue's only slot is held
    "delete": (lambda store, rid, who: delete(rid, principal=who, store=store), "finished",
               lambda store, rid: rid not in [r.id for r in store.runs()]),
    "edit": (lambda store, rid, who: edit_run(rid, principal=who, name="renamed", tags=["x"], notes="n", store=store),
             "finished", lambda store, rid: (store.get_run(rid).name, store.get_run(rid).tags) == ("renamed", ["x"])),
}


def test_every_action_has_a_rule_and_every_run_action_is_tested():
    # audit: reading the log (test_audit.py); database: `db upgrade` / `db copy` of a server database (test_db_commands.py)
    assert set(ACTIONS) == {"launch", "settings", "audit", "database", "tokens", *RUN_ACTIONS}
    assert {a for a, rule in RULES.items() if rule.own_run} == set(RUN_ACTIONS)


@pytest.mark.parametrize("action", RUN_ACTIONS)
@pytest.mark.parametrize("who", [VIEWER, BOB], ids=["viewer", "other-member"])
def test_run_action_refused_for_a_viewer_and_for_another_member_changes_nothing(full_queue, action, who):
    store, home = full_queue, full_queue.path.parent
    call, status, _ = RUN_ACTIONS[action]
    run_dir = _seed(store, home, "r1", status)
    before, files = _snapshot(store), sorted(run_dir.iterdir())
    with pytest.raises(PermissionDenied) as err:
        call(store, "r1", who)
    message = str(err.value)
    assert message.startswith(f"permission denied: {action} run r1 by {who.name} ({who.role}, test): needs ")
    assert "\n" not in message and "owner (alice)" in message
    assert _snapshot(store) == before and len(store.runs()) == 2  # the blocker and r1, as they were
    assert sorted(run_dir.iterdir()) == files


@pytest.mark.parametrize("action", RUN_ACTIONS)
@pytest.mark.parametrize("who", [ALICE, ADMIN], ids=["owner", "admin"])
def test_run_action_allowed_for_the_owner_and_for_an_admin(full_queue, action, who):
    store, home = full_queue, full_queue.path.parent
    call, status, done = RUN_ACTIONS[action]
    run_dir = _seed(store, home, "r1", status)
    call(store, "r1", who)
    assert done(store, "r1")
    assert run_dir.exists() == (action != "delete")


LAUNCHES = {
    "launch": lambda who: [launch(load_recipe("grpo", ["train.steps=1"]), principal=who)],
    "launch_planned": lambda who: launch_planned(plan_runs(["grpo", "rloo"], overrides=["train.steps=1"]), group="g",
                                                 principal=who),
    "launch_group": lambda who: launch_group(["grpo", "rloo"], group="g", principal=who),
}


@pytest.mark.parametrize("how", LAUNCHES)
def test_a_viewer_cannot_launch_and_nothing_is_written(full_queue, how):
    store, home = full_queue, full_queue.path.parent
    before = _snapshot(store)
    with pytest.raises(PermissionDenied, match=r"^permission denied: launch by vic \(viewer, test\): needs role member or admin$"):
        LAUNCHES[how](VIEWER)
    assert _snapshot(store) == before
    assert not (home / "runs").exists()


@pytest.mark.parametrize("how", LAUNCHES)
def test_a_member_launches_and_owns_the_runs(full_queue, how):
    store = full_queue
    ids = LAUNCHES[how](ALICE)
    runs = [store.get_run(i) for i in ids]
    assert [(r.created_by, r.status) for r in runs] == [("alice", "queued")] * len(ids)
    # and only the owner (or an admin) may stop them
    with pytest.raises(PermissionDenied):
        cancel(ids[0], principal=BOB, store=store)
    cancel(ids[0], principal=ALICE, store=store)
    assert store.get_run(ids[0]).status == "cancelled"


@pytest.mark.parametrize("who", [VIEWER, ALICE], ids=["viewer", "member"])
def test_settings_save_refused_below_admin_leaves_the_file(tmp_path, who):
    save_settings(Settings(cpu_slots=2), tmp_path)
    before = (tmp_path / "settings.yaml").read_bytes()
    with pytest.raises(PermissionDenied, match=rf"^permission denied: settings by {who.name} .*: needs role admin$"):
        update_settings(Settings(cpu_slots=5), principal=who, home=tmp_path)
    assert (tmp_path / "settings.yaml").read_bytes() == before


def test_settings_save_allowed_for_an_admin(tmp_path):
    update_settings(Settings(cpu_slots=5), principal=ADMIN, home=tmp_path)
    assert load_settings(tmp_path).cpu_slots == 5


def test_an_action_without_a_principal_is_refused(full_queue):
    _seed(full_queue, full_queue.path.parent, "r1", "queued")
    with pytest.raises(PermissionDenied, match="needs an acting principal"):
        cancel("r1", principal=None, store=full_queue)
    with pytest.raises(TypeError):
        cancel("r1", store=full_queue)  # the argument has no default: forgetting it is not "admin"
    assert full_queue.get_run("r1").status == "queued"


def test_principal_roles_and_the_local_principal():
    with pytest.raises(ValueError, match="role='owner' is not allowed; one of: viewer, member, admin"):
        Principal("x", "owner", "test")
    local = local_principal()
    assert (local.role, local.auth) == ("admin", "local OS user") and local.name
    assert refusal(ADMIN, "settings") is None and refusal(ALICE, "launch") is None


def test_the_cli_acts_as_the_local_user_with_role_admin(full_queue, tmp_path):
    """`runs cancel` / `runs delete` of a run someone else launched work from the CLI (the local
    OS user is admin of the local store), and what the CLI launches is that user's."""
    import os
    import pwd

    store = full_queue
    _seed(store, store.path.parent, "theirs", "queued", owner="someone-else")
    res = cli(tmp_path, "runs", "cancel", "theirs")
    assert res.returncode == 0, res.stderr
    assert store.get_run("theirs").status == "cancelled"
    res = cli(tmp_path, "runs", "delete", "theirs")
    assert res.returncode == 0 and res.stdout.strip() == "deleted theirs", res.stderr
    res = cli(tmp_path, "launch", "grpo", "--set", "train.steps=1")
    assert res.returncode == 0, res.stderr
    assert store.get_run(res.stdout.strip()).created_by == pwd.getpwuid(os.geteuid()).pw_name


@pytest.mark.parametrize("action", list(RUN_ACTIONS))
def test_a_password_member_cannot_claim_the_runs_of_a_verified_name(fresh_home, action):
    """A shared-password sign-in only claims a name: typing the OS user's name (the owner of every
    run the CLI launched) gives no power over those runs, and what the member launches is recorded
    under the suffixed claim, which a verified name can never equal."""
    from workbench.runs.authz import PASSWORD_AUTH, local_user_name

    store = RunStore()
    call, status, _ = RUN_ACTIONS[action]
    _seed(store, fresh_home, "cli-run", status, owner=local_principal().owner)
    impostor = Principal(local_user_name(), "member", PASSWORD_AUTH)
    before = _snapshot(store)
    with pytest.raises(PermissionDenied, match=f"needs to be the run's owner \\({local_user_name()}\\)"):
        call(store, "cli-run", impostor)
    assert _snapshot(store) == before
    assert impostor.owner == f"{local_user_name()} (password)" and local_principal().owner == local_user_name()
    _seed(store, fresh_home, "pw-run", status, owner=impostor.owner)
    assert refusal(impostor, action, store.get_run("pw-run")) is None  # their own launches stay theirs


def test_the_pages_reach_no_unauthorised_writer():
    """The app's pages act through the service only: no page imports the unauthorised settings
    writer or calls a store method that writes (the service authorises, then calls those)."""
    import re

    import workbench.runs as wr
    from workbench.runs.store import RunStore as Store

    assert "save_settings" not in wr.__all__ and not hasattr(wr, "save_settings")
    writers = ("create_run", "create_runs", "update_run", "set_status", "delete", "reopen", "rename", "set_tags",
               "set_notes", "ingest", "claim_queued", "cancel_queued", "record_audit")
    writers = [w for w in writers if hasattr(Store, w)]
    ui = Path(__file__).resolve().parents[2] / "workbench" / "ui"
    for page in ui.rglob("*.py"):
        text = page.read_text()
        assert "save_settings" not in text, page
        calls = re.findall(r"store\(\)\.(\w+)\(|\bstore\.(\w+)\(", text)
        assert not {a or b for a, b in calls} & set(writers), page
