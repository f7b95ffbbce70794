"""`streamlit run app/asgi.py`: the pages (app/main.py) and the OpenAI API (under /v1) over one model, in one
process on one port. `playground` starts it this way; see app/hosted.py."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `streamlit run` puts app/ on the path, not the project root
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402

from app.hosted import ApiDoor, lifespan  # noqa: E402

app = st.App("main.py", middleware=[Middleware(ApiDoor)], lifespan=lifespan)
