"""Room-level services that are not the model: the hosted room's join gate (join.py)."""
