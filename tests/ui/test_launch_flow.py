"""The Launch page and the flow after it (issue 19): feedback at the button that launched, the
link opening what was launched, unique default groups, inert sweeps said before the click, the
built-in models and grouped tasks in the form's help, and chat samples on Live / Compare."""

from __future__ import annotations

from urllib.parse import parse_qs

import pytest

from tests.ui.conftest import page
from tests.ui.seed import add_run
from workbench import runs as wr
from workbench.runs.authz import local_principal


@pytest.fixture
def cleanup(store):
    yield
    for run_id in store.list_runs()["id"]:
        wr.cancel(run_id, principal=local_principal(), store=store, grace_s=5)


def order(at) -> list[tuple[str, str]]:
    """(element type, key or text) of every element of the page, in drawing order."""
    out = []
    for node in at.main:
        kind = getattr(node, "type", "")
        key = getattr(node, "key", None) or getattr(getattr(node, "proto", None), "label", None) or str(getattr(node, "value", ""))
        out.append((kind, str(key)))
    return out


def position(at, kind: str, text: str) -> int:
    """Index in drawing order of the first element of ``kind`` whose key / label / value holds ``text``."""
    for i, (k, key) in enumerate(order(at)):
        if k == kind and text in key:
            return i
    raise AssertionError(f"no {kind} with {text!r} on the page: {[k for k, _ in order(at)][-20:]}")


def test_a_launch_answers_at_its_button_and_links_to_the_run(home, store, cleanup):
    """The message and the link were drawn at the top of the page, far from the button at the
    bottom; the link opened the newest group, not the run."""
    add_run(store, name="old", group="older-group")  # a group exists: Live / Compare opened it
    at = page("launch_page").run()
    at.text_input(key="rf:train.steps").input("2").run()
    at.button(key="launch_go").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    [run_id] = [i for i in store.list_runs()["id"] if not i.startswith("old")]
    button, message = position(at, "button", "launch_go"), position(at, "success", "Launched run")
    assert message > button > position(at, "selectbox", "launch_target")  # below the form, right after the button
    assert message - button <= 3
    [link] = at.get("page_link")
    assert link.proto.label == "Open Live / Compare" and parse_qs(link.proto.query_string) == {"run": [run_id]}
    assert not at.button(key="launch_go").disabled  # recorded: enabled again


def interrupted_after_launching(monkeypatch) -> None:
    """Make every launch end the way a second click's rerun ends it in the browser: the real launch
    runs, then a stop is queued, which Streamlit raises at the script's next Streamlit call (here
    the launch spinner's exit), before the page has recorded the launch."""
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

    launch = wr.launch_planned

    def launch_then_interrupt(*args, **kwargs):
        ids = launch(*args, **kwargs)
        get_script_run_ctx().script_requests.request_stop()
        return ids

    monkeypatch.setattr(wr, "launch_planned", launch_then_interrupt)


def click_as_still_enabled(at, key: str):
    """Click a button as a client that has not yet received the delta drawing it disabled (in a
    50 ms burst the next click leaves before the rerun's first messages arrive)."""
    button = at.button(key=key)
    button.proto.disabled = False
    return button.click()


def test_a_click_arriving_mid_launch_launches_nothing_more(home, store, cleanup, monkeypatch):
    """The second click's rerun interrupts the first after its launch, before the page recorded
    it: the old flow then said nothing of the run it had started (and in the browser, where such a
    click can reach the button's callback, a burst launched 2 runs). The flight carries the
    launch's ids; the next rerun shows that launch and adds none."""
    at = page("launch_page").run()
    at.text_input(key="rf:train.steps").input("2").run()
    interrupted_after_launching(monkeypatch)
    at.button(key="launch_go").click().run()
    assert len(store.list_runs()) == 1 and not at.success  # launched, not yet said
    assert at.button(key="launch_go").disabled  # drawn disabled while in flight
    click_as_still_enabled(at, "launch_go").run()  # the burst's next click
    [run_id] = store.list_runs()["id"]
    assert [m.value for m in at.success] == [f"Launched run: `{run_id}`. Watch it on **Live / Compare**."]
    assert "launch_flight" not in at.session_state and not at.button(key="launch_go").disabled
    at.run()  # a late rerun launches nothing either
    assert len(store.list_runs()) == 1


def test_a_click_reaching_the_callback_mid_flight_adds_nothing(home):
    """Whatever Streamlit lets through (a click sent while the client still drew the button
    enabled), the callback of a click that arrives while a flight is in the air keeps that flight:
    one flight, one launch."""
    from streamlit.testing.v1 import AppTest

    def script():
        import streamlit as st

        from workbench.ui.common import request_flight

        request_flight("flight")
        first = dict(st.session_state["flight"])
        request_flight("flight")
        st.text(f"kept: {first == st.session_state['flight']}")

    at = AppTest.from_function(script).run()
    assert not at.exception and [t.value for t in at.text] == ["kept: True"]


def test_a_quick_comparison_clicked_mid_launch_launches_one_group(home, store, cleanup, monkeypatch):
    """The quick comparison's button has the same flight: one group of 9 runs however the clicks fall."""
    at = page("launch_page").run()
    interrupted_after_launching(monkeypatch)
    at.button(key="quick_compare").click().run()
    click_as_still_enabled(at, "quick_compare").run()
    runs = store.list_runs()
    assert len(runs) == 3 * wr.QUICKSTART_SEEDS and runs["group"].nunique() == 1
    assert at.success and at.success[0].value.startswith(f"Launched comparison group **{runs['group'].iloc[0]}**")
    assert at.button(key="quick_compare").disabled  # its group is running


def test_a_flight_left_behind_by_a_page_change_is_dropped_not_launched(home, store, cleanup):
    """A click whose rerun was cut off before it launched because the user went to another page
    must not launch when the Launch page is next drawn: the app drops flights before it runs any
    page other than theirs. Here the other page is '/', which then switches to Launch: without the
    rule, Launch would carry the flight out."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app.py"), default_timeout=60)
    at.session_state["launch_flight"] = {"token": "cut-off", "at": 0.0}
    at.session_state["quick_flight"] = {"token": "cut-off", "at": 0.0}
    at.run()
    assert not at.exception and [t.value for t in at.title] == ["Launch"]
    assert "launch_flight" not in at.session_state and "quick_flight" not in at.session_state
    assert store.list_runs().empty


def test_a_flight_is_carried_out_however_long_its_rerun_took(home, store, cleanup):
    """On a loaded server the rerun of a click reached the launch over 30 s later and a time limit
    dropped it: the button stayed disabled and nothing was said. The page that made the flight
    launches it whatever its age."""
    at = page("launch_page").run()
    at.text_input(key="rf:train.steps").input("2").run()
    at.session_state["launch_flight"] = {"token": "slow", "at": 0.0}  # clicked long ago
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert len(store.list_runs()) == 1 and "launch_flight" not in at.session_state
    assert at.success and at.success[0].value.startswith("Launched run")


def test_live_compare_opens_the_run_or_group_the_link_names(home, store):
    from workbench.ui.launch_page import open_link_params

    run = add_run(store, name="single")
    add_run(store, name="a", group="newest", seed=1)
    assert open_link_params({"group": None, "ids": [run]}) == {"run": [run]}
    assert open_link_params({"group": "newest", "ids": ["x", "y"]}) == {"group": "newest"}
    at = page("compare_page")
    at.query_params["run"] = run
    at.run()
    assert not at.exception
    assert at.radio(key="compare_mode").value == "Runs" and at.multiselect(key="compare_pick").value == [run]
    at = page("compare_page")
    at.query_params["group"] = "newest"
    at.run()
    assert at.radio(key="compare_mode").value == "Group" and at.selectbox(key="compare_group_select").value == "newest"
    at.radio(key="compare_mode").set_value("Runs").run()  # the link chose once; the user's choice then stands
    assert at.radio(key="compare_mode").value == "Runs"


def test_default_group_names_are_unique():
    from workbench.ui.launch_page import GROUP_CHARS, unique_group

    assert unique_group("grpo-sweep", set()) == "grpo-sweep"
    assert unique_group("grpo-sweep", {"grpo-sweep"}) == "grpo-sweep-2"
    assert unique_group("grpo-sweep", {"grpo-sweep", "grpo-sweep-2"}) == "grpo-sweep-3"
    long = "x" * 60
    taken = {long[:GROUP_CHARS]}
    for _ in range(12):  # cut to the limit, suffix included
        name = unique_group(long, taken)
        assert len(name) <= GROUP_CHARS and name not in taken
        taken.add(name)


def test_relaunching_a_sweep_makes_a_new_group_and_a_taken_name_names_the_field(home, store, cleanup):
    """Re-launching failed on the default group name, with an error suggesting a CLI flag."""
    at = page("launch_page").run()
    at.text_input(key="rf:train.steps").input("1").run()
    at.text_input(key="rf:train.mu").input("2").run()
    at.multiselect(key="launch_sweep_fields").select("algorithm.eps_high").run()
    at.text_input(key="launch_sweep:algorithm.eps_high").input("0.2, 0.28").run()
    for _ in range(2):
        at.button(key="launch_go").click().run()
        assert not at.exception and not at.error, [e.value for e in at.error]
    assert sorted(store.groups()["group"]) == ["grpo-sweep", "grpo-sweep-2"]
    [field] = [t for t in at.text_input if t.label == "Comparison group"]
    assert field.value == "grpo-sweep-3"
    field.input("grpo-sweep").run()
    [error] = [e.value for e in at.error]
    assert error.startswith("Comparison group: group 'grpo-sweep' already has arm") and "Comparison group field" in error
    assert "--" not in error and at.button(key="launch_go").disabled and len(store.list_runs()) == 4


def test_an_inert_sweep_is_said_beside_the_sweep_editor_before_the_click(home):
    at = page("launch_page").run()
    at.multiselect(key="launch_sweep_fields").select("algorithm.eps_high").run()
    at.text_input(key="launch_sweep:algorithm.eps_high").input("0.2, 0.28").run()
    editor, target = position(at, "text_input", "launch_sweep:algorithm.eps_high"), position(at, "selectbox", "launch_target")
    [error] = [e for e in at.error if "algorithm.eps_high" in e.value]
    assert error.value.startswith("Sweep algorithm.eps_high: no effect in any arm (") and "mu" in error.value
    assert editor < position(at, "error", "Sweep algorithm.eps_high") < target and at.button(key="launch_go").disabled
    # inert in some arms only (mu swept too): a warning naming those arms, the launch allowed
    at.multiselect(key="launch_sweep_fields").select("train.mu").run()
    at.text_input(key="launch_sweep:train.mu").input("1, 2").run()
    [warning] = [w.value for w in at.warning if "algorithm.eps_high" in w.value]
    assert warning.startswith("Sweep algorithm.eps_high: no effect in 2 of 4 arms (grpo · eps_high=0.2 · mu=1, "
                              "grpo · eps_high=0.28 · mu=1)")
    assert position(at, "warning", "Sweep algorithm.eps_high") < position(at, "selectbox", "launch_target")
    assert not at.button(key="launch_go").disabled


def test_the_model_help_lists_every_built_in_model_with_its_needs(home):
    from workbench.model_facts import MODEL_CARDS, builtin_model_names

    help_ = page("launch_page").run().text_input(key="rf:model").help
    for name in builtin_model_names():
        card = MODEL_CARDS[name]
        assert f"`{name}`: {card.parameters}" in help_ and card.memory in help_ and card.step_time in help_
    assert "smollm2-135m" in help_ and "11 s generation + 20 s training" in help_


def test_every_figure_on_a_model_card_is_one_the_readme_records():
    """The cards claimed a '~0.04 s' step and '<0.5 GiB' nobody had measured; every figure with a
    unit (s, GiB, x) on a card must be one the README records with its command."""
    import re
    from pathlib import Path

    from workbench.model_facts import MODEL_CARDS

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for name, card in MODEL_CARDS.items():
        text = f"{card.parameters} {card.memory} {card.step_time}"
        figures = re.findall(r"\d[\d.,-]* ?(?:GiB|s\b|x\b)", text)
        assert figures, name
        for figure in figures:
            assert figure in readme, f"{name}: {figure!r} is not in the README"


def test_the_task_picker_is_grouped_and_searchable_by_family(home):
    from reasoning_gym.factory import DATASETS

    from workbench.engine.tasks import TASKS, task_catalogue
    from workbench.ui.recipe_form import NO_TASK, task_label

    catalogue = task_catalogue()
    assert next(iter(catalogue)) == "built-in" and catalogue["built-in"] == sorted(TASKS)
    grouped = [name for names in catalogue.values() for name in names]
    assert sorted(grouped) == sorted([*TASKS, *(f"reasoning_gym/{n}" for n in DATASETS)])  # each once
    assert "reasoning_gym/basic_arithmetic" in catalogue["reasoning-gym · arithmetic"]
    box = page("launch_page").run().selectbox(key="rf:task")
    labels = [task_label(v) for v in grouped]
    assert box.options == [*labels, NO_TASK] and len(set(labels)) == len(labels)
    assert "built-in / arithmetic" in box.options and "reasoning-gym · games / sudoku" in box.options
    assert box.value == "arithmetic_four" and "Type to search" in box.help


def test_chat_samples_show_the_question_first_and_the_completion_beside(home, store):
    system = "You are a helpful assistant. " * 20
    question = "What is 3 + 4? ![x](http://evil.example/t.png) **[win](javascript:alert(1))**"  # a dataset's text
    run = add_run(store, name="chat", steps=0)
    store.ingest(run, [{"kind": "samples", "step": 0, "time": 1.0, "samples": [
        {"prompt": [{"role": "system", "content": system}, {"role": "user", "content": question}],
         "completion": "<answer>7</answer>", "reward": 1.0, "advantage": 0.5, "length": 6, "truncated": False}]}])
    at = page("compare_page").run()
    assert not at.exception
    chats = at.get("chat_message")
    assert [c.proto.name for c in chats] == ["user", "assistant"]
    assert chats[0].get("text")[0].value == question and not chats[0].markdown  # plain text, never markdown
    assert chats[1].get("text")[0].value == "<answer>7</answer>"
    [expander] = [e for e in at.expander if e.label.startswith("Earlier messages")]
    assert expander.label == "Earlier messages (1: system)" and system.strip() in expander.get("text")[0].value
    assert any("reward **1.000**" in c.value for c in at.caption)
    assert not any("{'role'" in str(getattr(e, "value", "")) for e in at.main)  # no raw JSON
