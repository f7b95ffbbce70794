"""Inference Playground engine: a real Llama-family model, instrumented, one step record at a time.

The engine knows models, tokens and tensors; it never imports a UI library. Its subpackages:
models (loading), core (hooks, generation, records), serving, speculative, lab (measured) and
projection (torch-free). docs/architecture.md draws them.
"""
