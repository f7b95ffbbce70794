"""Which drafts this server can offer for speculative decoding: the launcher's draft model and every installed
extra that shares the loaded model's vocabulary and is smaller (judged from configs, without loading weights).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from engine.projection.card import param_counts
from engine.core.loader import ALIASES, EMBEDDED, LoadedModel, cache_dir, read_spec
from engine.projection.specs import MODEL_PRESETS, ModelSpec

EXTRA_PRESETS = {"qwen-0.5b": "qwen2.5-coder-0.5b", "qwen-1.5b": "qwen2.5-coder-1.5b"}   # extra key -> ModelSpec preset


@dataclass(frozen=True)
class DraftModelOption:
    name: str            # what load_model takes: an extra's key or a folder
    label: str
    usable: bool
    reason: str = ""     # why it cannot draft for the loaded model


def is_model_spec(text: str) -> bool:
    return not (text == "ngram" or text.startswith(("ngram:", "early-exit", "early_exit")))


def extra_installed(key: str) -> bool:
    """Converted already, or its chunk packages are installed (the first use converts them)."""
    if (cache_dir() / EMBEDDED[key].folder / "config.json").exists():
        return True
    # the extras' chunk packages: looked up only for a model not converted yet
    from engine.models.extras import EXTRAS, package_chunks

    return all(package_chunks(module) for module in EXTRAS[key].modules())


def candidate_spec(name: str) -> tuple[ModelSpec | None, str]:
    """(ModelSpec, label) of a draft candidate without loading its weights; None when it cannot be read."""
    key = ALIASES.get(name, name)
    if key in EXTRA_PRESETS:
        return MODEL_PRESETS[EXTRA_PRESETS[key]], EMBEDDED[key].label
    folder = cache_dir() / EMBEDDED[key].folder if key in EMBEDDED else os.path.expanduser(name)
    try:
        return read_spec(folder, str(name)), str(name)
    except Exception:  # noqa: BLE001 - a hub id or a broken folder: loading it will say what is wrong
        return None, str(name)


def judge_candidate(name: str, target: ModelSpec, target_label: str) -> DraftModelOption:
    """Usable when it shares the target's vocabulary size and is smaller (the tokenizer is checked at load)."""
    spec, label = candidate_spec(name)
    if spec is None:
        return DraftModelOption(name, label, True)
    if spec.vocab_size != target.vocab_size:
        return DraftModelOption(name, label, False,
                                f"{label} has {spec.vocab_size:,} vocabulary rows and {target_label} has "
                                f"{target.vocab_size:,}: a draft must share the target's tokenizer")
    if param_counts(spec).total >= param_counts(target).total:
        return DraftModelOption(name, label, False, f"{label} is not smaller than {target_label}")
    return DraftModelOption(name, label, True)


def draft_model_options(lm: LoadedModel, launched: str | None = None) -> list[DraftModelOption]:
    """The launcher's draft model (PLAYGROUND_DRAFT) and every installed extra except the target itself."""
    target_key = ALIASES.get(lm.name, lm.name)
    names = [launched] if launched and is_model_spec(launched) else []
    names += [key for key in EXTRA_PRESETS if key != target_key and key not in names and extra_installed(key)]
    return [judge_candidate(name, lm.spec, lm.label) for name in names]
