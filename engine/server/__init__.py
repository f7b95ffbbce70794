"""The model server over HTTP: the OpenAI API and the playground's own routes (FastAPI + uvicorn), over one
EngineService. See docs/serving.md."""
