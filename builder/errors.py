"""The one base class of trident's own failures: the CLI prints them as one line."""


class TridentError(Exception):
    """A failure to report without a traceback. exit_code 2 means bad input."""

    exit_code = 1

    def __init__(self, message: str = "", exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
