"""How the pages sit on the screen: a narrower sidebar and tighter margins on a 1024-pixel projector, labels that wrap
instead of ending in '…', and a presenter layout (bigger type, the sidebar folded away) for the front of a room.

The presenter layout is a choice of this browser session: the sidebar's toggle, or `?layout=presenter` in the
address (kept in the address while it is on, so the link can be shared or bookmarked).

    presenter = configure_page()          # first thing in app/main.py: st.set_page_config and the page's CSS
    ...
    layout_toggle()                       # in the sidebar
"""
from __future__ import annotations

import streamlit as st

PRESENTER_KEY = "layout.presenter"
QUERY_KEY, QUERY_VALUE = "layout", "presenter"
SIDEBAR_PX = 256                 # Streamlit's default is 300: 30% of a 1024-pixel projector
PLOT_FONT_PX = 15                # chart text in the presenter layout (plotly's default is 12)

# Always: at projector widths the page keeps its content width (margins of 1.5 rem, metric values a little smaller),
# and metrics (label and value), button captions and the menu's longest titles wrap onto a second line rather than
# lose their ends.
BASE_CSS = """
@media (max-width: 1280px) {
  [data-testid="stMainBlockContainer"] { padding-left: 1.5rem; padding-right: 1.5rem; }
  [data-testid="stMetricValue"] { font-size: 1.75rem; }
}
[data-testid="stMetric"] [data-testid="stMarkdownContainer"],
[data-testid="stMetric"] [data-testid="stMarkdownContainer"] p,
button [data-testid="stMarkdownContainer"], button [data-testid="stMarkdownContainer"] p,
[data-testid="stSidebarNavLink"] [data-testid="stMarkdownContainer"],
[data-testid="stSidebarNavLink"] [data-testid="stMarkdownContainer"] p {
  white-space: normal; overflow: visible; text-overflow: clip; overflow-wrap: anywhere;
}
"""
# The presenter layout: larger type everywhere (Streamlit sizes its text in rem) and the full width for content.
PRESENTER_CSS = """
html { font-size: 20px; }
[data-testid="stMainBlockContainer"] { padding: 2.5rem 1rem 2rem 1rem; max-width: none; }
[data-testid="stMetricValue"] { font-size: 1.6rem; }
"""


def presenter_layout() -> bool:
    """Whether this session shows the presenter layout (first from the address, then from the toggle)."""
    if PRESENTER_KEY not in st.session_state:
        st.session_state[PRESENTER_KEY] = st.query_params.get(QUERY_KEY) == QUERY_VALUE
    return bool(st.session_state[PRESENTER_KEY])


def keep_in_address(presenter: bool) -> None:
    """`?layout=presenter` in the address exactly while the presenter layout is on."""
    if presenter:
        st.query_params[QUERY_KEY] = QUERY_VALUE
    elif st.query_params.get(QUERY_KEY) == QUERY_VALUE:
        del st.query_params[QUERY_KEY]


def configure_page() -> bool:
    """st.set_page_config and the CSS of this session's layout; returns whether it is the presenter layout."""
    presenter = presenter_layout()
    st.set_page_config(page_title="Inference Playground", page_icon=":material/science:", layout="wide",
                       initial_sidebar_state="collapsed" if presenter else SIDEBAR_PX)
    st.html(f"<style>{BASE_CSS}{PRESENTER_CSS if presenter else ''}</style>")
    keep_in_address(presenter)
    return presenter


def layout_toggle() -> None:
    """The sidebar's switch between the usual layout and the presenter layout."""
    with st.sidebar:
        st.toggle("Presenter layout", key=PRESENTER_KEY,
                  help="Bigger type and the sidebar folded away, for a projector. Also `?layout=presenter` in the "
                       "address. Open the sidebar (top left) to switch it off.")


def plot_font() -> int | None:
    """Chart text size for this session's layout (None: plotly's own)."""
    return PLOT_FONT_PX if st.session_state.get(PRESENTER_KEY) else None
