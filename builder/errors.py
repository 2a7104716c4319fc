"""The one base class of trident's own failures: the CLI prints them as one line; and
trident's exit codes, defined here only."""

EXIT_OK = 0
EXIT_FAILURE = 1  # the job failed: invalid repository, server down, build failed
EXIT_USAGE = 2  # bad input: a spec defect, a bad argument
EXIT_INTERRUPTED = 130


class TridentError(Exception):
    """A failure to report without a traceback. exit_code EXIT_USAGE means bad input."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str = "", exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


def printable(text: str) -> str:
    """text on one line: control and other unprintable characters as escapes, so a
    hostile file name or key cannot add lines to an error message."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
