"""The app's pages, declared in one place (sections, titles, url paths) so that pages can link to
each other with ``st.switch_page`` and the navigation can be checked without a browser."""

from __future__ import annotations

from typing import Callable, NamedTuple

import streamlit as st

from workbench.ui.heap import import_page


class PageSpec(NamedTuple):
    render: Callable[[], None]
    title: str
    url_path: str
    icon: str | None = None
    hidden: bool = False  # reachable by its address and by links, not listed in the sidebar


def _render(module: str) -> Callable[[], None]:
    """The page's render function, imported on the first visit (not when the navigation is built)."""
    def render() -> None:
        import_page(f"workbench.ui.{module}").render()

    render.__name__ = render.__qualname__ = f"render_{module}"
    return render


def lab_sections() -> dict[str, list[PageSpec]]:
    """The labs' navigation sections, from their registry (``workbench.ui.labs.labs()``), in the
    order a learner takes them (``SECTIONS``); each page under its sidebar label."""
    from workbench.ui.labs import SECTIONS, labs

    sections = {section: [PageSpec(p.render, p.label, p.url, hidden=p.hidden) for p in labs() if p.section == section]
                for section in SECTIONS}
    return {section: pages for section, pages in sections.items() if pages}


def page_specs() -> dict[str, list[PageSpec]]:
    """Navigation sections -> their pages, in order; the first page is the default."""

    sections = {
        "Workbench": [
            PageSpec(_render("launch_page"), "Launch", "launch", ":material/rocket_launch:"),
            PageSpec(_render("runs_page"), "Runs", "runs", ":material/list:"),
            PageSpec(_render("compare_page"), "Live / Compare", "compare", ":material/monitoring:"),
            PageSpec(_render("export_page"), "Export", "export", ":material/download:"),
            PageSpec(_render("settings_page"), "Settings", "settings", ":material/settings:"),
            PageSpec(_render("audit_page"), "Audit", "audit", ":material/policy:"),  # admins only (the service says)
            PageSpec(_render("tokens_page"), "API tokens", "tokens", ":material/key:"),  # admins only (the service says)
        ],
    }
    return sections | lab_sections()


def _page(spec: PageSpec) -> st.Page:
    return st.Page(spec.render, title=spec.title, url_path=spec.url_path, icon=spec.icon,
                   visibility="hidden" if spec.hidden else "visible")


def _home() -> None:
    """'/' opens the first page at its own address: Streamlit serves a default page only at '/',
    so with Launch as the default, opening /launch directly said "Page not found"."""
    st.switch_page(page(next(iter(page_specs().values()))[0].url_path))


def navigation() -> dict[str, list[st.Page]]:
    """Sections of st.Page objects for st.navigation: every page at its url path, and a hidden
    default page at '/' that switches to the first workbench page."""
    home = st.Page(_home, title="RL Workbench", url_path="home", default=True, visibility="hidden")
    sections = {section: [_page(s) for s in pages] for section, pages in page_specs().items()}
    first = next(iter(sections))
    sections[first] = [home, *sections[first]]
    return sections


def page(url_path: str) -> st.Page:
    """The st.Page with this url path (for st.switch_page and st.page_link)."""
    for pages in page_specs().values():
        for spec in pages:
            if spec.url_path == url_path:
                return _page(spec)
    raise ValueError(f"page url_path={url_path!r} does not exist")
