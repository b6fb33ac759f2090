"""Errors that the CLI turns into one readable line and exit code 2."""


class UsageError(Exception):
    """Bad input from the user: the message names the thing, the place and the fix."""
