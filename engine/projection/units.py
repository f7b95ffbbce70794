"""Sizes as the playground writes them: one convention for every page, the CLI and every message.

Decimal units throughout, as the reference figures use them: 1 KB = 10^3 bytes, 1 MB = 10^6, 1 GB = 10^9,
1 TB = 10^12 (Llama 3.1 8B in BF16: 8.03 B x 2 bytes = 16.06 GB).

One figure is binary by nature: a GPU's memory. The spec sheet's "80 GB" of HBM is 80 GiB (80 x 2^30 bytes;
nvidia-smi shows an H100 80GB as 81,559 MiB), so wherever a card's capacity enters arithmetic it is written
once as `card_size(80)` = "80 GiB = 85.90 GB" and every further number is in GB, so the sums add up on screen.
"""
from __future__ import annotations

KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12
MIB, GIB = 2**20, 2**30           # binary units: HBM capacity and the server's `--*-mb` settings (MiB)
_UNITS = ((TB, "TB"), (GB, "GB"), (MB, "MB"), (KB, "KB"))


def fmt_bytes(n: float, digits: int = 2) -> str:
    """1_310_720 -> '1.31 MB'; 16_060_522_496 -> '16.06 GB'; below 1 KB, whole bytes ('512 B')."""
    value = float(n)
    for size, unit in _UNITS:
        if abs(value) >= size:
            return f"{value / size:,.{digits}f} {unit}"
    return f"{value:,.0f} B"


def card_bytes(memory_gb: float) -> float:
    """A GPU's memory in bytes: the spec sheet's GB read as GiB."""
    return memory_gb * GIB


def card_size(memory_gb: float) -> str:
    """The stated conversion of a card's capacity: 80 -> '80 GiB = 85.90 GB'."""
    return f"{memory_gb:g} GiB = {fmt_bytes(card_bytes(memory_gb))}"


CONVENTION = (f"Sizes are decimal: 1 GB = 10⁹ bytes, 1 MB = 10⁶ bytes. A GPU's “80 GB” of memory is "
              f"{card_size(80)}: memory chips come in binary sizes of 2³⁰ bytes.")
