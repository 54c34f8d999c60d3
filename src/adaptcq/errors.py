"""Errors a user can see. Each names what is wrong and where."""

from __future__ import annotations

import re
import unicodedata


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
        # Show only the line that holds the position, with a caret under it. A line ends at
        # "\n", "\r\n" or a lone "\r" (an old Mac file: the terminal would overprint it).
        sql, pos = self.sql, self.position
        lineno, start = 1, 0
        for brk in LINE_BREAK.finditer(sql):
            if brk.end() > pos:   # (at the "\n" of a "\r\n": the end of this line)
                break
            lineno, start = lineno + 1, brk.end()
        brk = LINE_BREAK.search(sql, start)
        line = sql[start:brk.start() if brk else len(sql)]
        col = pos - start
        # The column counts characters; the caret is padded by display width (a tab is
        # kept as a tab, so it lines up at any tab stop) so that it stands under the part.
        caret = (_pad(line[:col])
                 + "^" * max(1, len(_pad(line[col:col + self.length]).expandtabs(1))))
        return f"{self.message} (line {lineno}, column {col + 1})\n  {line}\n  {caret}"


# Where a line of query text ends (sqlglot counts lines so too: ``cql`` maps its positions)
LINE_BREAK = re.compile(r"\r\n|\r|\n")


def _pad(text: str) -> str:
    """Blank space as wide on a terminal as ``text``: tabs kept, East Asian wide and
    full-width characters two columns, combining marks and format characters (a zero-width
    joiner, a BOM) none, any other character one."""
    out = []
    for ch in text:
        if ch == "\t":
            out.append("\t")
        elif unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
            continue
        elif unicodedata.east_asian_width(ch) in ("W", "F"):
            out.append("  ")
        else:
            out.append(" ")
    return "".join(out)


class InputError(AdaptcqError):
    """Bad input data: names the stream, and the row or column, that is wrong."""


class JavaMissingError(AdaptcqError):
    """Spark needs a Java runtime (17 or newer) and none was found."""


class OptionError(AdaptcqError, ValueError):
    """An option, or a combination of options, that cannot be honoured: names it and why."""
