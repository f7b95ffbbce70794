"""The generation core: hooks, the prefill/decode loop, sampling and the typed records it yields."""
