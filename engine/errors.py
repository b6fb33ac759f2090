"""Errors of loading a model that say what to fix."""


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; the message says what to fix."""
