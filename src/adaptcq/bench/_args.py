"""Argument types and checks shared by the benchmark commands (``python -m adaptcq.bench.*``).

A bad value is an argparse error naming the option (exit 2, one line), before any data is
built: ``--runs 0`` once fell back to the default, ``--arrivals -5`` gave a traceback after
minutes of work. An option the chosen figure or mode does not read is refused
(``refuse_unused``), never ignored.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterable, Sequence


def _number(kind, text: str):
    try:
        value = kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _at_least(kind, low, strict: bool, doc: str):
    """An argparse type: a ``kind`` number >= ``low`` (> ``low`` if ``strict``)."""
    def parse(text: str):
        value = _number(kind, text)
        if value < low or (strict and value == low):
            bound = f"greater than {low}" if strict else f"at least {low}"
            raise argparse.ArgumentTypeError(f"{value:g} must be {bound}")
        return value
    parse.__doc__ = doc
    return parse


positive_int = _at_least(int, 1, False, "A whole number >= 1 (runs, arrivals, rows).")
nonnegative_int = _at_least(int, 0, False, "A whole number >= 0 (a seed, a count).")
positive_float = _at_least(float, 0, True, "A finite number > 0 (seconds, rates).")
nonnegative_float = _at_least(float, 0, False, "A finite number >= 0.")


def whole_at_least(low: int, why: str):
    """An argparse type: a whole number >= ``low``, the error saying ``why`` (``--arrivals``
    of a 3-stream workload: at least one arrival per stream, checked here rather than by
    the generator, whose error names its own ``--n-updates``)."""
    def parse(text: str) -> int:
        value = _number(int, text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be at least {low} ({why})")
        return value
    parse.__doc__ = f"A whole number >= {low} ({why})."
    return parse


def number_in(low: float, high: float, why: str):
    """An argparse type: a finite number in [``low``, ``high``] (``high`` may be inf), the
    error saying ``why`` (``--factors``: at least 1, the highest utility over the lowest)."""
    def parse(text: str) -> float:
        value = _number(float, text)
        if not low <= value <= high:
            bound = (f"at least {low:g}" if high == math.inf
                     else f"from {low:g} to {high:g}")
            raise argparse.ArgumentTypeError(f"{value:g} must be {bound} ({why})")
        return value
    parse.__doc__ = f"A finite number in [{low:g}, {high:g}] ({why})."
    return parse


def fraction(text: str) -> float:
    """A finite number in (0, 1]."""
    value = _number(float, text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{value:g} must be in (0, 1]")
    return value


def _items(text: str, what: str) -> list[str]:
    """The comma-separated items of ``text``, stripped; an empty one (``1,,4``, ``1,4,``)
    is refused by its position, not dropped."""
    items = [x.strip() for x in text.split(",")]
    if items == [""]:
        raise argparse.ArgumentTypeError(f"give at least one {what}")
    empty = [k + 1 for k, x in enumerate(items) if not x]
    if empty:
        raise argparse.ArgumentTypeError(f"{text!r}: item {empty[0]} of the comma-separated "
                                         f"list is empty; give a {what} in each")
    return items


def comma_list(item, what: str = "value"):
    """A comma-separated list of values, each checked by ``item`` (one of the types above),
    at least one (``--partitions 1,2,4``)."""
    def parse(text: str) -> list:
        return [item(x) for x in _items(text, what)]
    return parse


def choices(known: Iterable[str]):
    """A comma-separated list of names, each one of ``known`` (e.g. ``--cases a,b``)."""
    known = list(known)

    def parse(text: str) -> list[str]:
        names = _items(text, "name")
        bad = [x for x in names if x not in known]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(map(repr, bad))}; choose "
                                             f"from {', '.join(known)}")
        return names
    return parse


class _Unset(list):
    """Stands for an option not on the command line when ``given`` re-parses it: every
    action that takes a value replaces it (``store``), or copies it first (``append``,
    ``extend``: a list, so that they can) or adds to it (``count``): a new object each."""

    def __add__(self, other):  # count: "not given" + 1
        return other


def given(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
          dests: Iterable[str]) -> list[str]:
    """Which of ``dests`` (options' dests) ``argv`` (None: ``sys.argv[1:]``) gives, typed
    out, whatever the value: ``parser`` parses it again into a namespace where each of
    them stands unset (argparse sets a default only where the namespace has none). For a
    sub-command's parser, ``argv`` is what follows the sub-command's name."""
    unset = _Unset()
    dests = list(dests)
    ns = argparse.Namespace(**{d: unset for d in dests})
    parser.parse_known_args(sys.argv[1:] if argv is None else list(argv), ns)
    return [d for d in dests if getattr(ns, d, unset) is not unset]


def refuse_unused(parser: argparse.ArgumentParser, unused: Iterable[str], why: str, *,
                  argv: Sequence[str] | None) -> None:
    """``parser.error`` naming each option in ``unused`` (dests) that the command line
    gives: an option the chosen figure or mode does not read.

    ``argv``: the arguments ``parser`` parsed (None: ``sys.argv[1:]``; for a sub-command's
    parser, those after its name); an option typed there counts even with its default
    value (``--runs 3`` where 3 is the default), which comparing values could not see."""
    named = given(parser, argv, unused)
    if named:
        flags = ", ".join("--" + d.replace("_", "-") for d in named)
        parser.error(f"{flags}: not used {why}")


def physical_memory() -> int:
    """This machine's physical memory in bytes (``os.sysconf``; 0 where unknown)."""
    import os
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX hosts
        return 0


def refuse_oversized(parser: argparse.ArgumentParser, flag: str, value: float,
                     nbytes: float, what: str, limit: float | None = None,
                     side: str = "at most") -> None:
    """``parser.error`` when ``flag``'s ``value`` makes the run allocate ``nbytes`` (an
    estimate: ``what`` says what is counted) beyond this machine's physical memory, naming
    the bound ``side`` ``limit`` (by default the largest value that fits, the estimate
    growing in proportion to ``value``). Before any work: a huge ``--seconds`` once ended in
    an ``_ArrayMemoryError`` traceback."""
    memory = physical_memory()
    if memory <= 0 or nbytes <= memory:
        return
    if limit is None:
        limit = value * memory / nbytes
    parser.error(f"{flag} {value:g}: {what} needs about {nbytes / 2**30:,.3g} GiB, more "
                 f"than this machine's {memory / 2**30:,.3g} GiB of memory; {flag} must be "
                 f"{side} about {limit:.3g}")
