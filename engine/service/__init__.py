"""The model as a service: one engine core (the scheduler over the loaded model) behind a typed client interface,
in-process or over HTTP (engine/server/), with every run kept for inspection; and the hosted room's join gate
(join.py). See docs/serving.md."""
