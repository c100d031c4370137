"""The server's page imports freeze the heap once per page module (``workbench.ui.heap``).

Run in a subprocess: freezing is process-wide, and the test must see a process whose first page
import is the one it makes (not one after the suite's other tests)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Opens the app (its default page, Launch, is imported by the navigation), then checks which of
# three markers the collector still tracks: one made before the first run, one after it, one
# after a page already imported was drawn again.
SCRIPT = """
import gc, json, sys
from streamlit.testing.v1 import AppTest

def tracked(obj):
    return any(o is obj for gen in range(3) for o in gc.get_objects(gen))

before = ["made before the first page import"]
assert tracked(before) and gc.get_freeze_count() == 0
at = AppTest.from_file(sys.argv[1], default_timeout=120).run()
assert not at.exception, at.exception
after_first = ["made after the first page import"]
frozen_first = gc.get_freeze_count()
at.run()  # Launch again: its module is imported, nothing is frozen
print(json.dumps({"launch_imported": "workbench.ui.launch_page" in sys.modules, "frozen": frozen_first,
                  "frozen_after_rerun": gc.get_freeze_count(), "before_tracked": tracked(before),
                  "after_first_tracked": tracked(after_first)}))
"""


def test_the_first_import_of_a_page_freezes_the_heap_once(home):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "app.py")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "WORKBENCH_HOME": str(home)})
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["launch_imported"]
    # the imports (streamlit, pandas, the workbench's modules) are frozen: well over 50,000 objects
    assert seen["frozen"] > 50_000, seen
    assert not seen["before_tracked"]  # alive at the first page import: exempt from collections
    # a page imported before does not freeze again, so what was made since stays collectable (the
    # count may fall: frozen objects are still freed when their last reference goes)
    assert seen["frozen_after_rerun"] <= seen["frozen"]
    assert seen["after_first_tracked"]


def test_import_page_returns_the_module_and_freezes_once_per_module(tmp_path):
    (tmp_path / "wb_heap_probe_page.py").write_text("VALUE = 41\n")
    (tmp_path / "wb_heap_probe_other.py").write_text("VALUE = 42\n")
    script = """
import gc, json, sys
sys.path.insert(0, sys.argv[1])
from workbench.ui.heap import import_page
import wb_heap_probe_page as already

def tracked(obj):
    return any(o is obj for g in range(3) for o in gc.get_objects(g))

before = ["made before the first call"]
same = import_page("wb_heap_probe_page") is already  # loaded before: returned as it is, and frozen after
between = ["made between the calls"]
again = import_page("wb_heap_probe_page") is already  # asked for again: nothing frozen
kept = tracked(between)
other = import_page("wb_heap_probe_other").VALUE  # another module: frozen after it too
print(json.dumps({"same": same, "again": again, "before_tracked": tracked(before), "between_tracked_after_second": kept,
                  "between_tracked_after_other": tracked(between), "other": other}))
"""
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["same"] and seen["again"] and seen["other"] == 42
    assert not seen["before_tracked"]  # the first call froze it
    assert seen["between_tracked_after_second"]  # the second call of the same module froze nothing
    assert not seen["between_tracked_after_other"]  # a new module's first call froze it
