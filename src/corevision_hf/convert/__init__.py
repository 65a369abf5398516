"""Converters from the authors' reference checkpoints to hub folders (`python -m corevision_hf.convert.<model>`)."""
