"""The error every format raises for a file it cannot read: one line naming the file and what is wrong."""

from __future__ import annotations


class FormatError(ValueError):
    """A file or folder that is not a readable checkpoint of the expected format (the message names it)."""
