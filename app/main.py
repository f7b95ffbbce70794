"""Entry point: `streamlit run app/main.py`. Navigation, the shared model, this session's place on the
server, the presenter's pushes and the sidebar; pages do the rest."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `streamlit run` puts app/ on the path, not the project root
    sys.path.insert(0, str(ROOT))

import pandas  # noqa: E402,F401 - imported by every run before any page: see below
import streamlit as st  # noqa: E402

from app.hosting.runner_fixes import install as fix_script_runs  # noqa: E402
from app.room.join import admit  # noqa: E402
from app.ui.layout import configure_page, layout_toggle  # noqa: E402
from app.hosting.model import away_now, get_model, note_away, restart_notice  # noqa: E402
from app.ui.nav import HOME, PAGES, page_info  # noqa: E402
from app.ui.nav import menu as menu_of_pages  # noqa: E402
from app.room.session import follow_presenter, join_session  # noqa: E402
from app.sidebar import render_sidebar  # noqa: E402
from app.runs.live import open_run_link  # noqa: E402
from app.runs.recent import reopen_last  # noqa: E402
from app.runs.watch import fill_form, watch_slot, watch_strip  # noqa: E402
from engine.errors import EngineError  # noqa: E402
from engine.service.client import ServerUnavailableError  # noqa: E402

# pandas first: Streamlit imports it lazily (st.dataframe), and plotly peeks at sys.modules for it while it
# builds a figure. On a fresh server, one session's first table and another's chart at the same moment
# gave plotly the half-imported module (AttributeError: partially initialized module 'pandas'), a
# traceback in that browser. Importing it here makes every run wait until it is whole.
fix_script_runs()                                 # a room of followers: no blank or half-drawn page (runner_fixes.py)
configure_page()                                  # st.set_page_config, the projector and presenter layouts
home = st.Page(HOME.path, title=HOME.title, icon=HOME.icon, default=True)
by_url = {p.url_path: st.Page(p.path, title=p.title, icon=p.icon, url_path=p.url_path) for p in PAGES}
menu: dict[str, list] = {"": [home]}                # grouped, so the whole menu fits a projector's height
menu.update({section: [by_url[info.url_path] for info in infos] for section, infos in menu_of_pages().items()})
away = away_now()                                 # the model server restarting: no client is handed out meanwhile
admit(menu)                                       # a hosted room's join code: a stranger gets the join form only
current = st.navigation(menu, expanded=True)     # every page listed: no "View more" on a projector
here = page_info(current.url_path)                # what nav.py says about this page
if away is not None:                              # say so; pages that need no model (recordings, runs) go on
    restart_notice(away)
    if not here.offline:
        st.stop()
lm = get_model()


def switch(page: str) -> None:
    st.switch_page(by_url.get(page, home))


try:
    refused = join_session(lm)
    open_run_link(None if refused else lm)        # ?run=<id>: a run made through the API, on every page
    reopen_last(lm.limits if lm is not None else None, lm)  # a reload, a second tab, a restart: the last run
    fill_form()                                   # a run adopted last run: its request in the form
    follow_presenter(current.url_path, here.widget_namespace, switch)
    render_sidebar(lm)
except ServerUnavailableError:                    # it went away since the look above: this run again, without it
    note_away()
    st.rerun()
except EngineError as err:                        # a limit set by hand cannot work
    st.error(f"The model is not available right now: {err}")
    st.stop()
layout_toggle()
if refused:
    st.error(refused)
    if not here.offline:
        st.stop()
slot = watch_slot()                               # the presenter's live run, at the top of the page
try:
    current.run()
    watch_strip(slot, current.url_path, switch)  # last of the run (pages end without st.stop())
except ServerUnavailableError:                    # the model server went away while the page drew
    note_away()
    st.rerun()
