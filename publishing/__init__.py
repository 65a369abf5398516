"""A distilled checkpoint on the hub: `python -m publishing.publish ...` stages and uploads it with its evaluation and
the model card that `publishing.model_card` renders (run both from the repository root)."""
