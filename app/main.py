"""Entry point: `streamlit run app/main.py`. Navigation, the shared model and the sidebar; pages do the rest."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `streamlit run` puts app/ on the path, not the project root
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from app.model import get_model  # noqa: E402
from app.nav import HOME, PAGES  # noqa: E402
from app.sidebar import render_sidebar  # noqa: E402

st.set_page_config(page_title="Inference Playground", page_icon=":material/science:", layout="wide")
home = st.Page(HOME.path, title=HOME.title, icon=HOME.icon, default=True)
pages = [st.Page(p.path, title=p.title, icon=p.icon, url_path=p.url_path) for p in PAGES]
current = st.navigation([home, *pages])
render_sidebar(get_model())
current.run()
