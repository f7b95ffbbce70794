"""Model loading: the embedded default, the extras, a local folder or a hub id; what a model folder holds."""
