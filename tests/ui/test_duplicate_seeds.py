"""A store an older version left with two runs of one arm and seed (no unique index yet): the
pages that score arms say why there is no verdict (st.info, as the verdict table does) instead of
a Streamlit traceback. Live / Compare's sweep view and the Experiments lab's paper check used to
raise DuplicateSeedError."""

from __future__ import annotations

import sqlite3

from tests.ui.conftest import page
from tests.ui.test_arms_view import add_seed
from tests.ui.test_experiments import add_finished_group, experiments_page
from workbench.runs.store import UNIQUE_SEED_INDEX


def _copy_run(store, run_id: str) -> None:
    """Insert a second run with ``run_id``'s group, arm, seed and metrics, as racing launches of an
    older version did (the unique index dropped first, as in such a file)."""
    with sqlite3.connect(store.path) as db:
        db.execute(f"DROP INDEX IF EXISTS {UNIQUE_SEED_INDEX}")
        columns = [r[1] for r in db.execute("PRAGMA table_info(runs)") if r[1] != "id"]
        db.execute(f"INSERT INTO runs (id, {', '.join(columns)}) SELECT ?, {', '.join(columns)} FROM runs WHERE id = ?",
                   (run_id + "-copy", run_id))
        db.execute("INSERT INTO metrics SELECT ?, step, time, data FROM metrics WHERE run_id = ?", (run_id + "-copy", run_id))


def _infos(at) -> list[str]:
    return [i.value for i in at.info]


def test_the_sweep_view_says_why_with_a_duplicate_seed(home, store):
    ids = [add_seed(store, f"grpo · eps_high={value}", seed, 6, 0.1, group="sweep", sweep={"algorithm.eps_high": value})
           for value in (0.2, 0.28) for seed in range(3)]
    _copy_run(store, ids[0])
    at = page("compare_page").run()
    assert not at.exception, at.exception
    assert any("seed 0" in m and f"{ids[0]}-copy" in m for m in _infos(at)), _infos(at)


def test_the_experiments_paper_check_says_why_with_a_duplicate_seed(store):
    add_finished_group(store)
    _copy_run(store, "run-0.28-0")
    at = experiments_page().run()
    at.selectbox(key="exp_pick").set_value("clip-higher").run()
    assert not at.exception, at.exception
    assert any("seed 0" in m and "run-0.28-0-copy" in m for m in _infos(at)), _infos(at)
    assert not at.success and not at.warning  # no paper verdict from copies
