"""The generation core: load a model, hook it, prefill and decode, sample, and yield typed records."""
