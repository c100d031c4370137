"""The app's pages, declared in one place (sections, titles, url paths) so that pages can link to
each other with ``st.switch_page`` and the navigation can be checked without a browser."""

from __future__ import annotations

import importlib
from typing import Callable, NamedTuple

import streamlit as st


class PageSpec(NamedTuple):
    render: Callable[[], None]
    title: str
    url_path: str
    icon: str | None = None


def _render(module: str) -> Callable[[], None]:
    return importlib.import_module(f"workbench.ui.{module}").render


def page_specs() -> dict[str, list[PageSpec]]:
    """Navigation sections -> their pages, in order; the first page is the default."""
    from workbench.ui.labs import LAB_PAGES

    sections = {
        "Workbench": [
            PageSpec(_render("launch_page"), "Launch", "launch", ":material/rocket_launch:"),
            PageSpec(_render("runs_page"), "Runs", "runs", ":material/list:"),
            PageSpec(_render("compare_page"), "Live / Compare", "compare", ":material/monitoring:"),
            PageSpec(_render("export_page"), "Export", "export", ":material/download:"),
            PageSpec(_render("settings_page"), "Settings", "settings", ":material/settings:"),
        ],
    }
    labs = [PageSpec(fn, title, url) for fn, title, url in LAB_PAGES]
    if labs:
        sections["Labs"] = labs
    return sections


def _page(spec: PageSpec, default: bool = False) -> st.Page:
    return st.Page(spec.render, title=spec.title, url_path=spec.url_path, icon=spec.icon, default=default)


def navigation() -> dict[str, list[st.Page]]:
    """Sections of st.Page objects for st.navigation (the first workbench page is the default)."""
    specs = page_specs()
    return {section: [_page(s, default=(section == "Workbench" and i == 0)) for i, s in enumerate(pages)]
            for section, pages in specs.items()}


def page(url_path: str) -> st.Page:
    """The st.Page with this url path (for st.switch_page)."""
    first = next(iter(page_specs().values()))[0]
    for pages in page_specs().values():
        for spec in pages:
            if spec.url_path == url_path:
                return _page(spec, default=spec is first or spec.url_path == first.url_path)
    raise ValueError(f"page url_path={url_path!r} does not exist")
