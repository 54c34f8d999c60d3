"""Errors a user can see. Each names what is wrong and where."""

from __future__ import annotations


class AdaptcqError(Exception):
    """Base class of every error adaptcq raises on purpose."""


class QueryError(AdaptcqError):
    """A continuous query that cannot be run, with the place in its text.

    ``position`` is the 0-based character offset in ``sql`` of the offending part (or None
    when the whole query is at fault). ``str(error)`` shows the message and, below the query
    text, a caret under that position.
    """

    def __init__(self, message: str, sql: str | None = None, position: int | None = None,
                 length: int = 1):
        self.message = message
        self.sql = sql
        self.position = position
        self.length = max(1, length)
        super().__init__(self._render())

    def _render(self) -> str:
        if self.sql is None or self.position is None:
            return self.message
        # Show only the line that holds the position, with a caret under it.
        start = self.sql.rfind("\n", 0, self.position) + 1
        end = self.sql.find("\n", self.position)
        end = len(self.sql) if end < 0 else end
        line = self.sql[start:end]
        lineno = self.sql.count("\n", 0, self.position) + 1
        col = self.position - start
        caret = " " * col + "^" * min(self.length, max(1, len(line) - col))
        return f"{self.message} (line {lineno}, column {col + 1})\n  {line}\n  {caret}"


class InputError(AdaptcqError):
    """Bad input data: names the stream, and the row or column, that is wrong."""


class JavaMissingError(AdaptcqError):
    """Spark needs a Java runtime (17 or newer) and none was found."""


class OptionError(AdaptcqError, ValueError):
    """An option, or a combination of options, that cannot be honoured: names it and why."""
