"""Model files: the optional extras assembled from byte chunks, what a model folder holds, weights-free shaped checkpoints."""
