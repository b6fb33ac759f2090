"""Errors that the CLI turns into one readable line and exit code 2."""


class UsageError(Exception):
    """Bad input from the user: the message names the thing, the place and the fix."""


class SpecError(UsageError):
    """A spec problem: one line naming the file, the line, the tier and the fix."""

    def __init__(self, source: str, line: int, message: str, tier: str | None = None) -> None:
        where = f"{source}:{line}" if line else source
        scope = f"tier {tier!r}: " if tier else ""
        super().__init__(f"{where}: {scope}{message}")
        self.source, self.line, self.tier = source, line, tier
