"""The speculative-decoding page: drafts on offer, what a run measured (numbers), its figures and sections."""
