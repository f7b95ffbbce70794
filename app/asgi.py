"""`streamlit run app/asgi.py`: the pages (app/main.py) and the OpenAI API (under /v1) over one model, in one
process on one port. `playground` starts it this way; see app/hosting/hosted.py."""
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `streamlit run` puts app/ on the path, not the project root
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402

from app.hosting.hosted import ApiDoor, start_hosted  # noqa: E402
from app.hosting.model import api_key, load_here, model_choice  # noqa: E402


@asynccontextmanager
async def lifespan(_app: Any) -> AsyncIterator[None]:
    """At server start: the model begins loading (unless this process is a client of a model server)."""
    if model_choice().url is None:
        start_hosted(lambda progress: load_here(model_choice(), progress), api_key())
    yield


app = st.App("main.py", middleware=[Middleware(ApiDoor)], lifespan=lifespan)
