"""Streamlit entry point: ``streamlit run app.py``. Pages live in ``workbench/ui``.

The sidebar holds the navigation (Workbench, then the labs by section) and the sign-in form; a background
collector thread keeps the run store in step with running runs while the app is up.
"""

import streamlit as st

from workbench import runs as wr
from workbench.ui import auth, page_guard
from workbench.ui.common import drop_flights_elsewhere
from workbench.ui.nav import navigation

page_guard.install()  # a live page's late fragment tick never takes a session back to the page it left
st.set_page_config(page_title="RL Workbench", page_icon=":material/science:", layout="wide")
page = st.navigation(navigation(), expanded=True)  # every section in full: a learner sees the path
auth.sidebar()
wr.ensure_collector()
drop_flights_elsewhere(page.url_path)  # a launch clicked on a page the user has left never happens
page.run()
