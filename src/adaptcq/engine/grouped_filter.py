"""Grouped filters: many queries' selections over one column, probed at once (cacq.txt
§3.2.6, Figure 5), and opaque filters for the selections a grouped filter cannot take.

A :class:`GroupedFilter` belongs to one (source, column) and holds every predicate
``column OP constant`` of every query over that source, each as a (constant, tag bit) pair:
the paper's point is that the predicate itself (source, column, query) need not be stored.
A probe with a tuple's value answers, for all predicates together, which tags it fails and
which it satisfies, as two bitmaps (Python ints).

**Tags** (§3.2.7). A predicate is added either as a *conjunct* (a whole CNF clause of some
query: its tag fails when the predicate is not TRUE) or as a *disjunct* (one atom of a
clause of several: its tag is set when the predicate is TRUE). Several predicates may share
a tag: a conjunct tag fails when any of its predicates is not TRUE (``a > 3 AND a < 9`` of
one query), a disjunct tag passes when any of its predicates is TRUE. Conjunct and
disjunct tags are two separate numberings.

**Structures** (Figure 5). The paper has a greater-than tree, a less-than tree, an equality
hash and an inequality hash; ``>=`` and ``<=`` go into a tree and the equality hash. Here:

- greater-than: the constants of ``>`` and ``>=`` in one sorted array, with ``>=`` before
  ``>`` among equal constants. The predicates TRUE for a value v are then a prefix: the
  constants below v (``bisect_left``) plus the ``>=`` ones equal to v (a hash of their
  counts: the paper's equality-hash entry of a ``>=``). Precomputed prefix and suffix ORs
  of the tags give the disjuncts passed and the conjuncts failed in O(1) after the
  O(log n) bisection: no walk over the matching predicates;
- less-than: the mirror image (``<`` before ``<=``; TRUE predicates are a suffix);
- equality hash: ``=`` c is ``IN {c}``; per constant, the disjunct tags it satisfies and
  the conjunct tags all of whose IN-predicates hold it (the others fail);
- inequality hash: ``!=`` c is ``NOT IN {c}``, the mirror image;
- ``IS NULL`` / ``IS NOT NULL``: two masks.

The arrays and hashes are rebuilt lazily, at the first probe after a change (queries come
and go rarely; tuples arrive constantly), into a probe function generated for exactly the
structures in use (as the engine compiles its pipelines).

**Values** (SQL semantics, as ``expr.compile_predicate``). NULL (None): no comparison or
IN is TRUE, ``IS NULL`` is. A float NaN compares as it does in compiled predicates (as in
Python): ``!=``, ``NOT IN`` and ``IS NOT NULL`` are TRUE, nothing else. Constants must be
non-NULL, non-NaN and hashable; the constants of ``<``, ``<=``, ``>``, ``>=`` must be
comparable with each other (``add`` raises ``TypeError`` otherwise). A probe value that
cannot be ordered against those constants (a string against numbers: the parser refuses
such queries when it has the schemas) raises ``TypeError`` naming the filter, the value and
a constant, as the compiled predicate would raise on it too; it is never silently wrong.
Equality and IN compare by Python ``==``/hash, so a value of another type is simply not
equal (also as compiled code).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable
from typing import Any

from adaptcq.checks import is_int
from adaptcq.engine.codegen import exec_source
from adaptcq.errors import AdaptcqError

OPS = ("<", "<=", ">", ">=", "=", "!=", "in", "not in", "is null", "is not null")
"""The predicate kinds of :meth:`GroupedFilter.add` (``query.cnf.Atom.op``)."""

_ORDERED = frozenset({"<", "<=", ">", ">="})
_SETS = frozenset({"=", "!=", "in", "not in"})
_NULL_TESTS = frozenset({"is null", "is not null"})
# For a NaN value (Python's comparison semantics, which compiled predicates have):
_TRUE_FOR_NAN = frozenset({"!=", "not in", "is not null"})

Predicate = tuple[str, Any, int, bool]  # (op, constant, tag bit, disjunct)


class FilterError(AdaptcqError):
    """A selection of an :class:`OpaqueFilter` raised (a UDF, cacq.txt §5): ``bit`` and
    ``disjunct`` are the tag of the failing atom, ``label`` its text, ``error`` what it
    raised (also the ``__cause__``), so the caller can remove the query owning the tag."""

    def __init__(self, bit: int, label: str, error: BaseException, disjunct: bool = False):
        self.bit = bit
        self.label = label
        self.error = error
        self.disjunct = disjunct
        what = label or "a selection"
        super().__init__(f"{what} (tag {bit}) raised {type(error).__name__}: {error}")


class GroupedFilter:
    """The grouped filter of column ``column`` of ``source`` (cacq.txt §3.2.6); ``position``
    is the column's index in the source's row tuples (see the module docstring)."""

    def __init__(self, source: str, column: str, position: int):
        self.source = source
        self.column = column
        self.position = position
        self.conjunct_bits = 0
        self.disjunct_bits = 0
        self._preds: list[Predicate] = []
        self.source_code = ""  # of the last generated probe, for explain/debugging

    # ----- predicates ---------------------------------------------------------------------
    def add(self, op: str, constant: object, bit: int, disjunct: bool = False) -> None:
        """Add ``column op constant`` under tag ``bit`` (a conjunct, or a disjunct of a
        multi-atom clause). ``constant`` is a frozenset (any iterable) for in / not in,
        ignored for the NULL tests."""
        if op not in OPS:
            raise ValueError(f"grouped filter {self}: unknown predicate {op!r} (one of "
                             f"{', '.join(OPS)})")
        if not is_int(bit) or bit < 0:
            raise ValueError(f"grouped filter {self}: tag bit {bit!r} is not an int >= 0")
        if op in _NULL_TESTS:
            constant = None
        elif op in ("in", "not in"):
            constant = frozenset(constant)
            for c in constant:
                self._check_constant(op, c)
        else:
            self._check_constant(op, constant)
            if op in _ORDERED:
                self._check_ordered(constant)
        self._preds.append((op, constant, bit, bool(disjunct)))
        if disjunct:
            self.disjunct_bits |= 1 << bit
        else:
            self.conjunct_bits |= 1 << bit
        self._invalidate()

    def remove(self, bit: int, disjunct: bool | None = None) -> None:
        """Remove every predicate tagged ``bit``: of both kinds (conjunct and disjunct tags
        are separate numberings: pass ``disjunct`` to remove only one kind)."""
        self._preds = [p for p in self._preds
                       if not (p[2] == bit and (disjunct is None or p[3] == disjunct))]
        self.conjunct_bits = self.disjunct_bits = 0
        for _, _, b, d in self._preds:
            if d:
                self.disjunct_bits |= 1 << b
            else:
                self.conjunct_bits |= 1 << b
        self._invalidate()

    def __len__(self) -> int:
        return len(self._preds)

    def predicates(self) -> list[Predicate]:
        """(op, constant, bit, disjunct) of every predicate, in the order added."""
        return list(self._preds)

    def __repr__(self) -> str:
        return f"GroupedFilter({self.source}.{self.column}, {len(self._preds)} predicates)"

    def __str__(self) -> str:
        return f"{self.source}.{self.column}"

    # ----- probing ------------------------------------------------------------------------
    def probe(self, value: object) -> tuple[int, int]:
        """(fail, passed): the conjunct tags with a predicate not TRUE for ``value``, the
        disjunct tags with a predicate TRUE for it."""
        self._build()
        return self.probe(value)  # the generated function, now an instance attribute

    def probe_row(self, row: tuple) -> tuple[int, int]:
        """``probe(row[position])``, without the extra call."""
        self._build()
        return self.probe_row(row)

    def _invalidate(self) -> None:
        # The generated functions live in the instance dict and shadow the methods; without
        # them the methods rebuild first.
        self.__dict__.pop("probe", None)
        self.__dict__.pop("probe_row", None)

    def _check_constant(self, op: str, c: object) -> None:
        if c is None:
            raise ValueError(f"grouped filter {self}: {op} NULL is never TRUE; it is not a "
                             "grouped-filter predicate (query.cnf keeps it opaque)")
        if isinstance(c, float) and math.isnan(c):
            raise ValueError(f"grouped filter {self}: NaN constant in {op}")
        hash(c)  # TypeError for an unhashable constant, now rather than at a probe

    def _check_ordered(self, c: object) -> None:
        other = next((p[1] for p in self._preds if p[0] in _ORDERED), None)
        if other is None:
            return
        try:
            c < other  # noqa: B015 - only whether it raises
        except TypeError:
            raise TypeError(f"grouped filter {self}: constant {c!r} cannot be ordered "
                            f"against constant {other!r}") from None

    def _build(self) -> None:
        probe, probe_row, source = _compile(self)
        self.source_code = source
        self.probe = probe
        self.probe_row = probe_row


def _compile(gf: GroupedFilter) -> tuple[Callable, Callable, str]:
    """Generate the probe of ``gf``'s current predicates (see the module docstring)."""
    ns: dict[str, object] = {"bisect_left": bisect.bisect_left,
                             "bisect_right": bisect.bisect_right}
    body: list[str] = []   # index computations
    fails: list[str] = []  # terms ORed into fail
    passes: list[str] = []  # terms ORed into passed
    null_fail = null_pass = nan_fail = nan_pass = 0
    is_null_conj = not_null_disj = 0
    gt: list[tuple[object, int, int, bool]] = []  # (constant, tie order, mask, disjunct)
    lt: list[tuple[object, int, int, bool]] = []
    ins: list[tuple[frozenset, int, bool]] = []
    nins: list[tuple[frozenset, int, bool]] = []
    for op, c, bit, disj in gf.predicates():
        mask = 1 << bit
        if op == "is null":
            null_pass |= mask if disj else 0
            is_null_conj |= 0 if disj else mask
        elif not disj:
            null_fail |= mask
        if op == "is not null" and disj:
            not_null_disj |= mask
        if disj:
            nan_pass |= mask if op in _TRUE_FOR_NAN else 0
        elif op not in _TRUE_FOR_NAN:
            nan_fail |= mask
        if op in (">", ">="):
            gt.append((c, 0 if op == ">=" else 1, mask, disj))
        elif op in ("<", "<="):
            lt.append((c, 0 if op == "<" else 1, mask, disj))
        elif op in ("=", "in"):
            ins.append((frozenset((c,)) if op == "=" else c, mask, disj))
        elif op in ("!=", "not in"):
            nins.append((frozenset((c,)) if op == "!=" else c, mask, disj))
    ns.update(NULL=(null_fail, null_pass), NAN=(nan_fail, nan_pass))
    if is_null_conj:
        ns["IS_NULL"] = is_null_conj
        fails.append("IS_NULL")
    if not_null_disj:
        ns["NOT_NULL"] = not_null_disj
        passes.append("NOT_NULL")
    if gt:
        _ordered(gt, "GT", "GE_AT", (body, fails, passes), ns, ascending_true=False)
    if lt:
        _ordered(lt, "LT", "LE_AT", (body, fails, passes), ns, ascending_true=True)
    _in_sets(ins, (fails, passes), ns)
    _not_in_sets(nins, (fails, passes), ns)
    body.append(f"return {' | '.join(fails) or '0'}, {' | '.join(passes) or '0'}")
    sample = next((c for c, *_ in gt + lt), None)
    ns["_incomparable"] = _incomparable_error(str(gf), sample)
    inner = "\n".join("        " + line for line in body)
    source = "\n".join([
        "def probe(v):",
        "    if v is None:",
        "        return NULL",
        "    try:",
        "        if v != v:  # NaN",
        "            return NAN",
        inner,
        "    except TypeError as e:",
        "        raise _incomparable(v, e) from e",
        "",
        "def probe_row(row):",
        f"    v = row[{gf.position}]",
        "    if v is None:",
        "        return NULL",
        "    try:",
        "        if v != v:  # NaN",
        "            return NAN",
        inner,
        "    except TypeError as e:",
        "        raise _incomparable(v, e) from e",
        ""])
    # Registered with linecache (as the pipelines are): a traceback shows the probe's line.
    out, _ = exec_source(f"<grouped filter {gf}>", source, ns)
    return out["probe"], out["probe_row"], source


def _ordered(entries: list, name: str, ties: str, out: tuple[list, list, list], ns: dict,
             ascending_true: bool) -> None:
    """One ordered structure. Greater-than (``ascending_true`` False): sorted by constant,
    ``>=`` first among ties; TRUE for v: the prefix of constants < v plus the ``>=`` equal to
    v. Less-than: ``<`` first among ties; TRUE for v: the suffix from the constants > v, plus
    the ``<=`` equal to v."""
    entries.sort(key=lambda e: (e[0], e[1]))
    consts = [e[0] for e in entries]
    n = len(entries)
    # tie-breaking entries equal to a constant: >= (greater-than) / <= (less-than) ones
    tie_kind = 0 if not ascending_true else 1
    at: dict[object, int] = {}
    for c, kind, _, _ in entries:
        if kind == tie_kind:
            at[c] = at.get(c, 0) + 1
    conj_prefix, disj_prefix = [0] * (n + 1), [0] * (n + 1)
    for i, (_, _, mask, disj) in enumerate(entries):
        conj_prefix[i + 1] = conj_prefix[i] | (0 if disj else mask)
        disj_prefix[i + 1] = disj_prefix[i] | (mask if disj else 0)
    conj_suffix, disj_suffix = [0] * (n + 1), [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        mask, disj = entries[i][2], entries[i][3]
        conj_suffix[i] = conj_suffix[i + 1] | (0 if disj else mask)
        disj_suffix[i] = disj_suffix[i + 1] | (mask if disj else 0)
    body, fails, passes = out
    ns[name] = consts
    if at:
        ns[ties] = at
    k = name.lower()
    if not ascending_true:  # TRUE: [0, k); not TRUE: [k, n)
        tie = f" + {ties}.get(v, 0)" if at else ""
        body.append(f"{k} = bisect_left({name}, v){tie}")
        fail, passed = conj_suffix, disj_prefix
    else:  # TRUE: [k, n); not TRUE: [0, k)
        tie = f" - {ties}.get(v, 0)" if at else ""
        body.append(f"{k} = bisect_right({name}, v){tie}")
        fail, passed = conj_prefix, disj_suffix
    if any(fail):
        ns[name + "_FAIL"] = fail
        fails.append(f"{name}_FAIL[{k}]")
    if any(passed):
        ns[name + "_PASS"] = passed
        passes.append(f"{name}_PASS[{k}]")


def _all_hold(entries: Iterable[tuple[frozenset, int]]) -> tuple[int, dict[object, int]]:
    """For (set, mask) predicates: the OR of the masks, and per constant the masks *all* of
    whose predicates contain it (a tag may have several predicates)."""
    total: dict[int, int] = {}
    count: dict[object, dict[int, int]] = {}
    every = 0
    for values, mask in entries:
        every |= mask
        total[mask] = total.get(mask, 0) + 1
        for c in values:
            per = count.setdefault(c, {})
            per[mask] = per.get(mask, 0) + 1
    held: dict[object, int] = {}
    for c, per in count.items():
        m = 0
        for mask, k in per.items():
            if k == total[mask]:
                m |= mask
        if m:
            held[c] = m
    return every, held


def _any_holds(entries: Iterable[tuple[frozenset, int]]) -> dict[object, int]:
    """Per constant, the OR of the masks of the predicates containing it."""
    hit: dict[object, int] = {}
    for values, mask in entries:
        for c in values:
            hit[c] = hit.get(c, 0) | mask
    return hit


def _in_sets(entries: list, out: tuple[list, list], ns: dict) -> None:
    """Equality hash: ``= c`` and ``IN S``. A conjunct tag fails unless every one of its
    IN-predicates holds v; a disjunct tag passes when one does."""
    fails, passes = out
    conj = [(s, m) for s, m, d in entries if not d]
    disj = [(s, m) for s, m, d in entries if d]
    if conj:
        every, held = _all_hold(conj)
        ns.update(IN_ALL=every, IN_OK=held)
        fails.append("IN_ALL & ~IN_OK.get(v, 0)" if held else "IN_ALL")
    if disj:
        ns["IN_HIT"] = _any_holds(disj)
        passes.append("IN_HIT.get(v, 0)")


def _not_in_sets(entries: list, out: tuple[list, list], ns: dict) -> None:
    """Inequality hash: ``!= c`` and ``NOT IN S``. A conjunct tag fails when one of its
    predicates holds v; a disjunct tag passes unless all of them do."""
    fails, passes = out
    conj = [(s, m) for s, m, d in entries if not d]
    disj = [(s, m) for s, m, d in entries if d]
    if conj:
        ns["NIN_HIT"] = _any_holds(conj)
        fails.append("NIN_HIT.get(v, 0)")
    if disj:
        every, held = _all_hold(disj)
        ns.update(NIN_ALL=every, NIN_ONLY=held)
        passes.append("NIN_ALL & ~NIN_ONLY.get(v, 0)" if held else "NIN_ALL")


def _incomparable_error(name: str, sample: object) -> Callable[[object, Exception], Exception]:
    def make(value: object, error: Exception) -> TypeError:
        against = f" with its constants (e.g. {sample!r})" if sample is not None else ""
        return TypeError(f"grouped filter {name}: cannot probe with the value {value!r} "
                         f"({type(value).__name__}){against}: {error}")
    return make


class OpaqueFilter:
    """The selections of one source that no grouped filter can take (column against
    column, arithmetic, UDFs: cacq.txt §3.2.6, §5), each a compiled predicate over the
    source's row (``expr.compile_predicate``) under a tag, with the tag semantics of
    :class:`GroupedFilter`. A predicate that raises makes :meth:`probe_row` raise
    :class:`FilterError` naming its tag and label."""

    def __init__(self, source: str = ""):
        self.source = source
        self.conjunct_bits = 0
        self.disjunct_bits = 0
        # (fn, mask, disjunct, bit, label)
        self._entries: list[tuple[Callable[[tuple], object], int, bool, int, str]] = []

    def add(self, fn: Callable[[tuple], bool | None], bit: int, disjunct: bool = False,
            label: str = "") -> None:
        """Add predicate ``fn`` (TRUE when it returns a truthy value; None is UNKNOWN)."""
        if not is_int(bit) or bit < 0:
            raise ValueError(f"opaque filter {self.source}: tag bit {bit!r} is not an int >= 0")
        if not callable(fn):
            raise TypeError(f"opaque filter {self.source}: {fn!r} is not callable")
        self._entries.append((fn, 1 << bit, bool(disjunct), bit, label))
        if disjunct:
            self.disjunct_bits |= 1 << bit
        else:
            self.conjunct_bits |= 1 << bit

    def remove(self, bit: int, disjunct: bool | None = None) -> None:
        """Remove every predicate tagged ``bit`` (both kinds unless ``disjunct`` says)."""
        self._entries = [e for e in self._entries
                         if not (e[3] == bit and (disjunct is None or e[2] == disjunct))]
        self.conjunct_bits = self.disjunct_bits = 0
        for _, mask, disj, _, _ in self._entries:
            if disj:
                self.disjunct_bits |= mask
            else:
                self.conjunct_bits |= mask

    def probe_row(self, row: tuple) -> tuple[int, int]:
        """(fail, passed) as :meth:`GroupedFilter.probe`; every predicate is evaluated
        (tags of many queries: no short cut, §3.2.7)."""
        fail = passed = 0
        for fn, mask, disj, bit, label in self._entries:
            try:
                ok = fn(row)
            except Exception as e:  # attributed to the tag, re-raised
                raise FilterError(bit, label, e, disj) from e
            if disj:
                if ok:
                    passed |= mask
            elif not ok:
                fail |= mask
        return fail, passed

    def probe_row_isolated(self, row: tuple) -> tuple[int, int, list[FilterError]]:
        """(fail, passed, errors): as :meth:`probe_row`, but a predicate that raises only
        fails its own tag (a conjunct's tag is in ``fail``, a disjunct's is not in
        ``passed``) and is reported in ``errors``; every other predicate is evaluated. The
        eddy calls it after :meth:`probe_row` raised, so that one query's failing UDF
        costs the other queries nothing."""
        fail = passed = 0
        errors: list[FilterError] = []
        for fn, mask, disj, bit, label in self._entries:
            try:
                ok = fn(row)
            except Exception as e:  # noqa: BLE001 - a UDF may raise anything; attributed to its tag
                errors.append(FilterError(bit, label, e, disj))
                if not disj:
                    fail |= mask
                continue
            if disj:
                if ok:
                    passed |= mask
            elif not ok:
                fail |= mask
        return fail, passed, errors

    def __len__(self) -> int:
        return len(self._entries)

    def predicates(self) -> list[Predicate]:
        """("opaque", label, bit, disjunct) of every predicate, in the order added."""
        return [("opaque", label, bit, disj) for _, _, disj, bit, label in self._entries]

    def __repr__(self) -> str:
        return f"OpaqueFilter({self.source}, {len(self._entries)} predicates)"
