"""Imports point downward: no module of the package imports the top-level CLI, and the shared
defaults below the run layer are one name read by every user."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "workbench"


def _imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` / ``from ... import`` statement of ``path`` names (also inside functions)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_module_of_the_package_imports_the_top_level_cli():
    # workbench.cli is the entry point: it imports the layers, none of them imports it back.
    # __main__ (``python -m workbench``) is the one module above it.
    importers = sorted(str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py")
                       if p.name != "__main__.py" and p != PACKAGE / "cli.py"
                       and "workbench.cli" in _imported_modules(p))
    assert importers == []


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_the_run_layer_reports_bad_input_without_the_top_level_cli():
    out = _python("import sys\nfrom workbench.runs.cli import _fail\n"
                  "code = _fail('runs show needs a run ID:\\n  give one')\n"
                  "print(code, 'workbench.cli' in sys.modules)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "False"]
    assert out.stderr == "error: runs show needs a run ID: give one\n"


def test_an_error_without_text_is_still_one_line():
    """`one_line("")` raised ValueError (nothing to unpack), so an exception raised with no message
    crashed main's error handler itself with a traceback."""
    out = _python("from workbench.console import one_line, report\n"
                  "print(one_line(ValueError()), one_line(KeyboardInterrupt('  \\n ')), report(''), report('\\n'))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ValueError", "KeyboardInterrupt", "2", "2"]
    assert out.stderr == "error: (no message)\n" * 2


def test_the_final_window_default_is_one_name():
    from workbench.analysis import DEFAULT_WINDOW_FRAC, final_window_scores, final_window_values
    from workbench.cli import build_parser
    from workbench.runs.experiments import Experiment
    from workbench.ui.common import verdict_table
    from workbench.viz.tables import verdict

    defaults = {f"{fn.__module__}.{fn.__name__}": inspect.signature(fn).parameters[arg].default
                for fn, arg in ((final_window_scores, "window_frac"), (final_window_values, "window_frac"),
                                (verdict, "window_frac"), (verdict_table, "window"))}
    defaults["Experiment.window"] = Experiment.__dataclass_fields__["window"].default
    defaults["compare --window"] = build_parser().parse_args(["compare", "g"]).window
    assert defaults == dict.fromkeys(defaults, DEFAULT_WINDOW_FRAC)
    assert DEFAULT_WINDOW_FRAC == 0.1  # the number did not change when it was named


def test_reading_the_default_window_and_building_the_parser_load_no_statistics():
    out = _python("import sys\nfrom workbench.analysis import DEFAULT_WINDOW_FRAC\nfrom workbench.cli import build_parser\n"
                  "build_parser()\nprint(sorted(m for m in ('scipy', 'torch', 'workbench.analysis.stats') if m in sys.modules))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_recipe_schema_imports_no_machine_check():
    """Recipe is a pure schema: what fits this machine (workbench.machine) sits above it."""
    out = _python("import sys\nimport workbench.recipe\nprint('workbench.machine' in sys.modules)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    assert not any(name.startswith("workbench.machine") for name in _imported_modules(PACKAGE / "recipe.py"))
