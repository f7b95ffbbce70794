"""Fixed prompts shared by the speculative-decoding benchmark and page, so their numbers compare."""

PASSAGE = ("The old lighthouse keeper climbed the spiral stairs every evening at dusk. He polished the great "
           "lens, trimmed the wick, and watched the ships pass safely beyond the rocks. In winter the storms "
           "were fierce, but the light never failed, and the sailors who passed the point each night never "
           "knew his name.")
CODE = '''def mean(values):
    total = 0
    for value in values:
        total += value
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for value in values:
        total += (value - m) ** 2
    return total / len(values)


def'''
SPECULATIVE_PROMPTS = {
    "code": "Continue this Python module with a function `std(values)` and a function `median(values)` in the "
            "same style. Reply with code only.\n\n```python\n" + CODE,
    "copy": "Repeat the following passage exactly, word for word:\n\n" + PASSAGE,
    "question": "Why do cats purr? Answer in a short paragraph.",
}
