"""Speculative decoding: drafts propose, the target verifies in one pass."""
