"""Typed errors the engine raises. The UI shows `str(err)`; none of them leaves the engine unusable."""
from __future__ import annotations


class EngineError(Exception):
    """Base class: a clear, user-facing message about what went wrong and what to do."""


class ModelNotFoundError(EngineError):
    """A model name, folder or hub id that cannot be found."""


class NoWeightsError(EngineError):
    """A folder without safetensors weights (pickled .bin weights are refused on purpose)."""


class UnsupportedModelError(EngineError):
    """An architecture outside the Llama family this engine instruments."""


class GGUFError(EngineError):
    """A GGUF file that cannot be read or converted."""


class HubUnavailableError(EngineError):
    """A hub id was given but no model hub can be reached from here."""


class InsufficientMemoryError(EngineError):
    """Not enough free memory for the weights or for the KV cache of a request."""


class ContextLengthError(EngineError):
    """A prompt (or prompt plus requested tokens) longer than the model's context window."""


class InvalidRequestError(EngineError):
    """A request whose settings are out of range: empty prompt, negative temperature, and so on."""


class DraftMismatchError(EngineError):
    """A speculative draft model whose vocabulary does not match the target's."""


class QueueFullError(EngineError):
    """The scheduler's queue is full; try again shortly."""


class RequestTimeoutError(EngineError):
    """A request ran past its wall-time limit and was stopped."""


class ConfigError(EngineError):
    """A model config that is missing, malformed, or describes an architecture the projection does not model."""
