"""Runs page: the table's columns and values, filters and sort, and the actions on a run."""

import time

import pandas as pd
import pytest
from streamlit import config

from tests.ui.conftest import page
from tests.ui.seed import LiveRun, add_run
from workbench.ui.auth import auth_policy
from workbench.viz.tables import filter_runs, runs_table
from workbench.runs.authz import Principal, local_principal


def seed(store):
    a = add_run(store, preset="grpo", name="alpha", steps=3, total=10, group="g1", tags=["x"], notes="first", reward_offset=0.5)
    b = add_run(store, preset="rloo", name="beta", steps=10, total=10, group="g1", owner="bob", reward_offset=0.1)
    c = add_run(store, preset="ppo", name="gamma", steps=1, total=4, status="failed", tags=["x", "y"])
    return a, b, c


def test_table_shows_status_progress_owner_reward_tags(home, store):
    a, b, c = seed(store)
    at = page("runs_page").run()
    assert not at.exception
    df = at.dataframe[0].value.set_index("name")
    assert list(df.columns) == ["id", "status", "progress", "step", "algorithm", "target", "owner", "reward", "group",
                                "tags", "notes", "created"]
    assert df.loc["alpha", "progress"] == 0.3 and df.loc["alpha", "step"] == "3/10"
    assert df.loc["beta", "progress"] == 1.0 and df.loc["beta", "owner"] == "bob"
    assert df.loc["alpha", "reward"] == 0.52  # reward of its last step (0.5 + 0.01 * 2)
    assert df.loc["gamma", "status"] == "failed" and df.loc["gamma", "tags"] == "x, y"
    assert df.loc["alpha", "notes"] == "first" and df.loc["alpha", "target"] == "local"


def test_filter_and_sort_widgets(home, store):
    seed(store)
    at = page("runs_page").run()
    at.multiselect(key="runs_status").select("finished").run()
    assert sorted(at.dataframe[0].value["name"]) == ["alpha", "beta"]
    at.selectbox(key="runs_sort").select("reward").run()
    assert at.dataframe[0].value["name"].tolist() == ["alpha", "beta"]  # 0.52 > 0.19, descending
    at.toggle(key="runs_desc").set_value(False).run()
    assert at.dataframe[0].value["name"].tolist() == ["beta", "alpha"]
    at.multiselect(key="runs_status").unselect("finished").run()
    at.selectbox(key="runs_tag").select("y").run()
    assert at.dataframe[0].value["name"].tolist() == ["gamma"]
    at.selectbox(key="runs_tag").select("").run()
    at.text_input(key="runs_search").input("BOB").run()
    assert at.dataframe[0].value["name"].tolist() == ["beta"]


def test_filter_runs_sorts_missing_rewards_last():
    table = pd.DataFrame({"id": ["1", "2", "3"], "name": ["a", "b", "c"], "status": ["running"] * 3, "algorithm": ["grpo"] * 3,
                          "owner": ["o"] * 3, "notes": [""] * 3, "group": [""] * 3, "tags": ["", "", ""],
                          "reward": [0.2, None, 0.7], "created": [1, 2, 3], "progress": [0.1, 0.2, 0.3]})
    assert filter_runs(table, sort="reward")["name"].tolist() == ["c", "a", "b"]
    assert filter_runs(table, sort="reward", descending=False)["name"].tolist() == ["a", "c", "b"]
    assert runs_table(pd.DataFrame()).empty


def test_rename_tag_and_annotate(home, store):
    a, _, _ = seed(store)
    at = page("runs_page").run()
    at.selectbox(key="runs_selected").select(a).run()
    at.text_input(key=f"runs_name:{a}").input("alpha2").run()
    at.text_input(key=f"runs_tags:{a}").input("best, keep").run()
    at.text_area(key=f"runs_notes:{a}").input("lr too high?").run()
    at.button(key=f"runs_save:{a}").click().run()
    run = store.get_run(a)
    assert (run["name"], run["tags"], run["notes"]) == ("alpha2", ["best", "keep"], "lr too high?")


def test_bad_name_error_names_the_field(home, store):
    a, _, _ = seed(store)
    at = page("runs_page").run()
    at.selectbox(key="runs_selected").select(a).run()
    at.text_input(key=f"runs_name:{a}").input("no/slashes").run()  # a name is a label: no path separators
    at.button(key=f"runs_save:{a}").click().run()
    assert at.error[0].value.startswith("name='no/slashes': character '/' is not allowed")
    assert store.get_run(a)["name"] == "alpha"
    at.text_input(key=f"runs_name:{a}").input("with spaces").run()  # the recipe's name rule allows it
    at.button(key=f"runs_save:{a}").click().run()
    assert not at.error and store.get_run(a)["name"] == "with spaces"


def test_delete_needs_confirmation(home, store):
    a, b, c = seed(store)
    at = page("runs_page").run()
    at.selectbox(key="runs_selected").select(c).run()
    assert at.button(key=f"runs_delete:{c}").disabled
    at.checkbox(key=f"runs_confirm:{c}").check().run()
    at.button(key=f"runs_delete:{c}").click().run()
    assert sorted(store.list_runs()["id"]) == sorted([a, b])


def test_cancel_a_live_run_stops_its_process(home, store):
    live = LiveRun(store, name="live")
    try:
        at = page("runs_page").run()
        at.selectbox(key="runs_selected").select(live.run_id).run()
        assert not at.button(key=f"runs_cancel:{live.run_id}").disabled
        at.button(key=f"runs_cancel:{live.run_id}").click().run()
        assert live.proc.wait(timeout=10) == -15  # SIGTERM reached the run's process group
        from workbench.runs import sync
        sync(store)
        assert store.get_run(live.run_id)["status"] == "cancelled"
    finally:
        live.stop()


def test_a_queued_click_never_acts_on_the_run_chosen_after_it(home, store):
    """Streamlit folds a click still queued into the next rerun, its trigger beside the newer
    widget values: with one Cancel button for every run, a click on run A's Cancel that arrived
    with another run chosen in the box cancelled that run (seen in the browser: a second click on
    Cancel, then the next run selected). Each action's key names its run, so the click is not read."""
    first, second = LiveRun(store, name="first"), LiveRun(store, name="second")
    try:
        at = page("runs_page").run()
        at.selectbox(key="runs_selected").select(first.run_id).run()
        cancel = next(b for b in at.button if b.label == "Cancel run")  # by label: the key is what changed
        cancel.click()
        at.selectbox(key="runs_selected").select(second.run_id)
        at.run()  # one rerun: the click on first's Cancel and second chosen
        assert not at.exception, at.exception
        time.sleep(1.0)
        assert first.proc.poll() is None and second.proc.poll() is None
        assert [store.get_run(r)["status"] for r in (first.run_id, second.run_id)] == ["running", "running"]
        at.button(key=f"runs_cancel:{second.run_id}").click().run()  # the button drawn for second acts on it
        assert second.proc.wait(timeout=10) == -15 and first.proc.poll() is None
    finally:
        first.stop()
        second.stop()


@pytest.mark.parametrize("blocked_by", ["password", "open address"])
def test_signed_out_session_sees_runs_with_actions_disabled(home, store, monkeypatch, blocked_by):
    """A protected app (a password set, or listening beyond localhost with none): the page renders
    and save / cancel / delete are disabled with the reason (they once raised TypeError)."""
    if blocked_by == "password":
        monkeypatch.setenv("WORKBENCH_PASSWORD", "s3cret")
        reason = "Sign in (sidebar) to launch, cancel or delete runs."
    else:
        config.set_option("server.address", "0.0.0.0")  # the home fixture restores it
        reason = auth_policy("0.0.0.0", None).reason
    live = LiveRun(store, name="live")
    try:
        at = page("runs_page").run()
        assert not at.exception, at.exception
        at.selectbox(key="runs_selected").select(live.run_id).run()
        at.checkbox(key=f"runs_confirm:{live.run_id}").check().run()
        assert not at.exception, at.exception
        for key in ("runs_save", "runs_cancel", "runs_delete"):
            button = at.button(key=f"{key}:{live.run_id}")
            assert button.disabled, key
            assert button.help == reason, key
    finally:
        live.stop()


def test_algorithm_column_shows_the_preset_not_the_run_name(home, store):
    """A run named by its user showed that name as its algorithm."""
    from workbench import runs as wr
    from workbench.recipe import load_recipe

    named = wr.launch(load_recipe("dapo", ["name=my-experiment", "train.steps=1"]), store=store, principal=Principal("t", "admin", "test"))
    tweaked = wr.launch(load_recipe("grpo", ["name=wider", "algorithm.eps_high=0.5", "train.steps=1"]), principal=Principal("t", "admin", "test"),
                        store=store)
    try:
        df = page("runs_page").run().dataframe[0].value.set_index("id")
        assert df.loc[named, "name"] == "my-experiment" and df.loc[named, "algorithm"] == "dapo"
        assert df.loc[tweaked, "algorithm"] == "grpo (modified)"
    finally:
        for run_id in (named, tweaked):
            wr.cancel(run_id, principal=local_principal(), store=store, grace_s=5)


def test_manage_selector_names_runs_without_a_status_that_could_go_stale(home, store):
    """The selector's label said 'starting' while the run ran and 'running' after a cancel (the
    browser keeps an option's label as first drawn); the status line beside it is refreshed."""
    a, b, c = seed(store)
    at = page("runs_page").run()
    assert set(at.selectbox(key="runs_selected").options) == {f"alpha · {a}", f"beta · {b}", f"gamma · {c}"}
    at.selectbox(key="runs_selected").select(c).run()
    assert any(m.value.startswith("Status: **failed**") for m in at.markdown)


def test_resume_button_only_for_failed_cancelled_or_lost_runs_and_it_relaunches_the_same_run(home, store):
    """Resume is offered for failed / cancelled / lost runs; it queues the same run (same id, row
    and run dir) again and starts `train --resume RUN_DIR` as a real detached process."""
    from workbench import runs as wr

    a, b, c = seed(store)  # alpha, beta finished; gamma failed
    lost = add_run(store, preset="grpo", name="delta", steps=2, total=4, status="lost")
    at = page("runs_page").run()
    for run_id, enabled in ((a, False), (b, False), (c, True), (lost, True)):
        at.selectbox(key="runs_selected").select(run_id).run()
        assert at.button(key=f"runs_resume:{run_id}").disabled is not enabled, run_id
    assert at.button(key=f"runs_resume:{lost}").help == "Start this run again in the same run (no checkpoint yet: from step 0)"
    at.selectbox(key="runs_selected").select(c).run()
    at.button(key=f"runs_resume:{c}").click().run()
    assert not at.exception, at.exception
    run = store.get_run(c)
    try:
        assert run["status"] in ("starting", "running") and run["error"] is None and run["launch"]["resume"] is True
        assert run["handle"]["command"].endswith(f"-m workbench train --resume {run['run_dir']}")
        assert [r["id"] for r in store.runs()] == [a, b, c, lost]  # no new run
    finally:
        wr.cancel(c, principal=local_principal(), store=store, grace_s=5)


def test_runs_and_export_pages_show_where_the_trained_model_is(home, store):
    a, b, c = seed(store)
    final = home / "runs" / b / "final"
    final.mkdir()
    (final / "config.json").write_text("{}")
    checkpoint = home / "runs" / c / "checkpoints" / "step-00000002"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    at = page("runs_page").run()
    at.selectbox(key="runs_selected").select(b).run()
    assert any(m.value.startswith(f"Trained model: `{final}`") for m in at.markdown)
    at.selectbox(key="runs_selected").select(c).run()
    assert any(m.value == f"Newest checkpoint: step 2 · `{checkpoint}`" for m in at.markdown)
    assert at.button(key=f"runs_resume:{c}").help == f"Continue this run at step 3, from its checkpoint {checkpoint}"
    at.selectbox(key="runs_selected").select(a).run()
    assert not any("Trained model" in m.value or "checkpoint" in m.value for m in at.markdown)

    export = page("export_page").run()
    export.selectbox(key="export_run_select").select(b).run()
    assert any(c.value.startswith(f"Trained model: `{final}`") for c in export.caption)
    export.selectbox(key="export_run_select").select(a).run()
    assert any(c.value.startswith("Trained model: none yet") for c in export.caption)
