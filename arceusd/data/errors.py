"""The one error family of the data loaders: a data file that is missing, malformed or unusable.

``DataError`` is a ``ValueError`` so callers that validate user input can catch it alongside other bad-value
errors. Every message names the file and says what was wrong.
"""

from __future__ import annotations


class DataError(ValueError):
    """A data file (or a request against a loaded data set) was unusable; the message says which and why."""


class IdxFormatError(DataError):
    """An IDX file was malformed: wrong magic, bad dimensions, truncated or oversized payload."""
