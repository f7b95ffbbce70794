"""The projected plane: model cards, costs, serving simulations and GPU spec sheets from configs alone (no torch)."""
