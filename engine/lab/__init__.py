"""The measured lab: experiments timed on this machine with the loaded model."""
