"""The attention pages: maps of every layer and head from a stored run (numbers, figures, sections), and one
head's arithmetic step by step (math).
"""
