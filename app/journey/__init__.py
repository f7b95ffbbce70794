"""The journey page: the input as tokens and shapes, the streaming answer, each token's candidates and logit
lens.
"""
