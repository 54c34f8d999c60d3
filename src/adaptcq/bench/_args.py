"""Argument types and checks shared by the benchmark commands (``python -m adaptcq.bench.*``).

A bad value is an argparse error naming the option (exit 2, one line), before any data is
built: ``--runs 0`` once fell back to the default, ``--arrivals -5`` gave a traceback after
minutes of work. An option the chosen figure or mode does not read is refused
(``refuse_unused``), never ignored.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable


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


def fraction(text: str) -> float:
    """A finite number in (0, 1]."""
    value = _number(float, text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{value:g} must be in (0, 1]")
    return value


def comma_list(item, what: str = "value"):
    """A comma-separated list of values, each checked by ``item`` (one of the types above),
    at least one (``--partitions 1,2,4``)."""
    def parse(text: str) -> list:
        values = [item(x.strip()) for x in text.split(",") if x.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"give at least one {what}")
        return values
    return parse


def choices(known: Iterable[str]):
    """A comma-separated list of names, each one of ``known`` (e.g. ``--cases a,b``)."""
    known = list(known)

    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        if not names:
            raise argparse.ArgumentTypeError("give at least one name")
        bad = [x for x in names if x not in known]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(map(repr, bad))}; choose "
                                             f"from {', '.join(known)}")
        return names
    return parse


def refuse_unused(parser: argparse.ArgumentParser, args: argparse.Namespace,
                  unused: Iterable[str], why: str) -> None:
    """``parser.error`` naming each option in ``unused`` (dests) given a value other than
    its default: an option the chosen figure or mode does not read."""
    given = [dest for dest in unused
             if getattr(args, dest, None) != parser.get_default(dest)]
    if given:
        flags = ", ".join("--" + d.replace("_", "-") for d in given)
        parser.error(f"{flags}: not used {why}")
