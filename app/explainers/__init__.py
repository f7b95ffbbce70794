"""The explainer pages: FlashAttention, quantization, the model folder, the engines map and the quiz, one
module each, and their figures.
"""
