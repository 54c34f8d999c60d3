"""Printing the user's text as written: query text, stream, column and cache names, paths
and messages hold characters rich reads as markup (``[range 2 seconds]`` eaten as a tag,
a ``[/]`` a MarkupError, ``lo[red]x`` shown as ``lox``) or emoji codes (``:cat:``).
Styles are given as (text, style) parts, never as markup."""

from __future__ import annotations

__all__ = ["row", "say"]


def say(console, *parts, **kwargs) -> None:
    """One line to ``console``: each part plain text, or (text, style)."""
    from rich.text import Text
    console.print(Text.assemble(*parts), **kwargs)


def row(table, *cells) -> None:
    """A table row whose cells are plain text, whatever console prints the table."""
    from rich.text import Text
    table.add_row(*(Text(str(c)) for c in cells))
