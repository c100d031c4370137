"""Page modules imported once per server process, and what they import kept out of the cyclic
garbage collector's full collections.

Why: CPython's full (generation 2) collection walks every object the collector tracks. A server
that has opened the Compare page tracks ~240,000 objects (~375,000 once a lab has imported
torch), nearly all of them its imports: modules, classes, functions, docstrings' code objects,
which live as long as the process. A full collection of them took ~210 ms, held the GIL (every
session and the collector thread stood still) and came every ~30 redraws of the arms view of
10 arms x 3 seeds while runs trained: ~8 ms a redraw on average and renders of 0.37 s where the
median is 0.12 s (``bench/ui_bench.py --unfrozen``; see README, Speed).

``import_page`` imports a page's module; the first time a module is asked for, it collects,
then moves every object alive to the permanent generation (``gc.freeze``), which full
collections skip. Objects frozen are still freed by reference counting as usual; what freezing
gives up is the collection of a *cycle* among them that becomes garbage later. Freezing happens at most once per
page module (13: 7 pages, 6 lab modules) per process, right after a collection, so what it keeps
from collection is the imports plus the sessions' state of those moments: bounded, never growing.
"""

from __future__ import annotations

import gc
import importlib
import threading
from types import ModuleType

_LOCK = threading.Lock()  # two sessions opening their first page at once freeze once
_FROZEN_FOR: set[str] = set()  # the page modules whose first load froze the heap


def import_page(module: str) -> ModuleType:
    """``importlib.import_module(module)`` (which waits while another thread is importing it: a
    module half made is never returned); the first time a module is asked for in this process,
    ``gc.collect()`` then ``gc.freeze()`` after it is loaded (the module docstring says why)."""
    loaded = importlib.import_module(module)
    if module not in _FROZEN_FOR:
        with _LOCK:
            if module not in _FROZEN_FOR:
                freeze_heap()
                _FROZEN_FOR.add(module)
    return loaded


def freeze_heap() -> int:
    """Collect cyclic garbage, then exempt every object alive from future collections; returns the
    number of objects now frozen (``gc.get_freeze_count``)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
