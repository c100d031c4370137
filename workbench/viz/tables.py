"""The Runs page's table: filter, sort and shape ``RunStore.list_runs()`` (pure pandas)."""

from __future__ import annotations

from typing import Iterable

import pandas as pd

from workbench.viz.curves import progress, step_label

# Sort keys the page offers: label -> column of the shaped table.
SORT_KEYS = {"created": "created", "name": "name", "status": "status", "algorithm": "algorithm",
             "reward": "reward", "progress": "progress", "owner": "owner"}
TABLE_COLUMNS = ["id", "name", "status", "progress", "step", "algorithm", "target", "owner", "reward", "group",
                 "tags", "notes", "created"]


def runs_table(runs: pd.DataFrame) -> pd.DataFrame:
    """list_runs() rows -> the displayed columns: progress in [0, 1], 'step' as 'k/N' steps done,
    owner, creation time as a timestamp, tags joined by ', '."""
    if runs.empty:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    out = pd.DataFrame({
        "id": runs["id"],
        "name": runs["name"],
        "status": runs["status"],
        "progress": [progress(int(s), int(t)) for s, t in zip(runs["last_step"], runs["total_steps"])],
        "step": [step_label(s, t) for s, t in zip(runs["last_step"], runs["total_steps"])],
        "algorithm": runs["algorithm"],
        "target": runs["target"] if "target" in runs else runs["launcher"],
        "owner": runs["created_by"],
        "reward": pd.to_numeric(runs["reward"], errors="coerce"),
        "group": runs["group"].fillna(""),
        "tags": [", ".join(t) for t in runs["tags"]],
        "notes": runs["notes"],
        "created": pd.to_datetime(runs["created_at"], unit="s"),
    })
    return out.reset_index(drop=True)


def filter_runs(table: pd.DataFrame, *, statuses: Iterable[str] = (), group: str | None = None,
                tag: str | None = None, search: str = "", sort: str = "created", descending: bool = True) -> pd.DataFrame:
    """Rows of ``runs_table`` matching every filter given, sorted by ``SORT_KEYS[sort]``.

    ``search`` matches (case-insensitively, as plain text) id, name, algorithm, owner and notes.
    Runs without a value in the sort column (no reward yet) go last either way.
    """
    if sort not in SORT_KEYS:
        raise ValueError(f"sort={sort!r} is not allowed; choose one of: {', '.join(SORT_KEYS)}")
    keep = pd.Series(True, index=table.index)
    statuses = list(statuses)
    if statuses:
        keep &= table["status"].isin(statuses)
    if group:
        keep &= table["group"] == group
    if tag:
        keep &= table["tags"].map(lambda t: tag in [x.strip() for x in t.split(",")])
    if search.strip():
        needle = search.strip().lower()
        text = table[["id", "name", "algorithm", "owner", "notes"]].astype(str).agg(" ".join, axis=1).str.lower()
        keep &= text.str.contains(needle, regex=False)
    view = table[keep]
    return view.sort_values(SORT_KEYS[sort], ascending=not descending, na_position="last", kind="stable").reset_index(drop=True)


def all_tags(table: pd.DataFrame) -> list[str]:
    return sorted({t.strip() for tags in table.get("tags", []) for t in tags.split(",") if t.strip()})
