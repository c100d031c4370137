"""Streamlit entry point: ``streamlit run app.py``. Pages live in ``workbench/ui``."""

import streamlit as st

from workbench.ui import advantages_page

st.set_page_config(page_title="RL Workbench", layout="wide")
page = st.navigation([st.Page(advantages_page.render, title="Advantages", url_path="advantages", default=True)])
page.run()
