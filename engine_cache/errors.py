"""The engine cache's one error type: the CLI prints it as one line."""
from builder.errors import TridentError


class CacheError(TridentError):
    """The cache cannot do what was asked (bad input, unreachable S3, unusable entry)."""
