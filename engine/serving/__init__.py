"""Serving: the queue in front of a continuous batch, its limits, the prefix cache, saved recordings."""
