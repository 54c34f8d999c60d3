"""The compiled back end of a pipeline plan (engine.plan): plan → Python source → function.

A pipeline compiles to nested loops over index buckets with the output projection inlined
in the innermost loop, cache probes and CacheUpdates inlined around them: the executors'
hot path. Names in the source are deterministic (slots ``v0``, ``v1``…, indexes ``I1``…,
caches ``C0``… in the executor's cache order, watchers ``O1_0``…), so the same plan gives
the same source in every run. Each source is registered with ``linecache`` under a
filename naming the pipeline (``<pipeline ΔR: S⋈T 1a2b3c4d>``, the suffix a digest of the
source), so a traceback through generated code shows its line; ``adaptcq explain --code``
prints it. Generated code reads SteMs; the one write is an insertion pipeline's last line,
which stores its row through the SteM's own ``insert``.

An insertion pipeline is ``pipeline(rid, v0, ts)``: the whole insertion, ending with the
row stored in the SteM (a copy while caches exist: engine.cache); ``emit`` is a global of
its namespace, which the executor rebinds. A deletion pipeline is ``pipeline(v0, sign, ts,
emit)``, run after the row left the SteM.
"""

from __future__ import annotations

import functools
import hashlib
import linecache
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from adaptcq.engine.plan import (
    CacheLookup,
    CacheUpdate,
    Emit,
    Key,
    Observe,
    PipelinePlan,
    Probe,
)
from adaptcq.query.expr import LITERAL_NAMESPACE
from adaptcq.query.logical import ColumnRef, LogicalQuery


@dataclass
class Compiled:
    """A compiled pipeline: the function, its source and the filename it runs under."""

    fn: Callable
    source: str
    filename: str


def projection_source(query: LogicalQuery, resolve: Callable[[ColumnRef], str]) -> str:
    """Python source of the output tuple's SELECT values (each followed by ", ")."""
    import sqlglot.expressions as exp

    from adaptcq.query.expr import to_python

    def one(e: exp.Expression) -> str:
        if isinstance(e, exp.Column):  # the common case, kept to a bare subscript
            return resolve(ColumnRef(e.table, e.name))
        return to_python(e, resolve, query.types)

    return "".join(one(o.expr) + ", " for o in query.outputs)


def key_source(key: Key, var: Callable[[int], str] = lambda slot: f"v{slot}") -> str:
    """A key read from slots: ``v1[0]`` for one part, ``(v1[0], v2[3], )`` for several."""
    parts = [f"{var(s)}[{p}]" for s, p in key]
    return parts[0] if len(parts) == 1 else "(" + ", ".join(parts) + ",)"


def null_test(key: Key, name: str = "u") -> str:
    """The NULL-key test of engine.rules (``is_null_key``) on a key variable."""
    return f"{name} is None" if len(key) == 1 else f"None in {name}"


def generate(query: LogicalQuery, plan: PipelinePlan, buckets: Mapping[str, int],
             counting: bool = False, fans: Sequence[Sequence[Probe]] | None = None,
             ) -> tuple[str, list[tuple[str, str]]]:
    """The source of ``plan`` and the free names it uses, as (name, what) pairs:
    ``("I1", "index")`` for slot 1's index (or window rows for a cartesian step),
    ``("C0", "cache")``, ``("C0T", "table")``, ``("C0N", "counts")``, ``("O1_0",
    "watcher")``, ``("EMPTY", "empty")``, ``("F0_1", "fan")``. ``buckets``: each cache's
    bucket count, inlined.

    ``counting`` (insertion plans only): the *profiled* pipeline ``profile(rid, v0, ts)``
    of a-caching.txt Appendix A, the same nested loops with counters, so that a profiled
    tuple costs a few times an unprofiled one instead of the interpreter's 7–40×. It runs
    cached segments through their probes ("no caches used"; CacheUpdates and Observes
    still run) and returns ``(delta, work, fanout, results)``, counted exactly as
    ``engine.interp`` counts them (a property test): per operator j the tuples reaching
    it and its work units, and with ``fans`` (per position j, one Probe for each stream
    of ``order[j:]``, the first the operator's own) the matches of each of those streams
    for the tuples reaching j (A-Greedy's conditional fan-outs)."""
    if counting and plan.kind != "insert":
        raise ValueError(f"{plan.name}: only insertion pipelines are profiled")
    cols = dict(plan.slots)
    stream_of = {k: s for s, k in plan.slots}
    names: dict[str, str] = {}
    n = len(plan.order)
    last = [0]  # slot of the latest probe generated: later work is charged to it

    def resolve(ref: ColumnRef) -> str:
        return f"v{cols[ref.stream]}[{query.columns[ref.stream].index(ref.column)}]"

    insert = plan.kind == "insert"
    # An insertion pipeline is the whole update: it ends by storing its row in the SteM
    # (one Python call per insertion); deletion pipelines run after the SteM delete.
    lines = ["def profile(rid, v0, ts):" if counting else
             "def pipeline(rid, v0, ts):" if insert else "def pipeline(v0, sign, ts, emit):"]
    if plan.copy:  # a distinct row object (engine.cache); returned for the SteM insert
        lines.append("    v0 = (*v0,)")
    if counting:  # locals, not lists: the counters are on the profiled tuple's hot path
        zero = [f"d{j}" for j in range(n)] + [f"w{j}" for j in range(n)] + ["res"]
        zero += [f"f{j}_{m}" for j in range(n) for m in range(len(fans[j]))] if fans else []
        lines.append("    " + " = ".join(zero) + " = 0")

    def charge(ind: str) -> None:
        """One work unit per tuple passing, at the latest operator (engine.interp.Counts)."""
        if counting and n:
            lines.append(f"{ind}w{max(last[0], 1) - 1} += 1")

    def fanouts(op: Probe, ind: str) -> bool:
        """The fan-out probes before operator j; True when the first (the operator's own
        stream) is the operator's probe itself, counted from its bucket."""
        j = op.slot - 1
        own = False
        for m, fp in enumerate(fans[j] if counting and fans else ()):
            if m == 0 and (fp.positions, fp.key, fp.scan) == (op.positions, op.key, op.scan):
                own = True
                continue
            names[f"F{j}_{m}"] = "fan"
            if fp.positions:
                lines.extend([f"{ind}f = F{j}_{m}.get({key_source(fp.key)})",
                              f"{ind}if f:", f"{ind}    f{j}_{m} += len(f)"])
            else:
                lines.append(f"{ind}f{j}_{m} += len(F{j}_{m})")
        return own

    def probe(op: Probe, ind: str) -> str:
        k = op.slot
        j = k - 1
        names[f"I{k}"] = "index" if op.positions else "rows"
        lines.append(f"{ind}# ⋈ {op.stream}" + (" (window scan)" if op.scan else "")
                     + ("" if op.positions else " (cartesian)"))
        last[0] = k
        own = False
        if counting:
            lines.append(f"{ind}d{j} += 1")
            own = fanouts(op, ind)
        if op.positions:
            lines.append(f"{ind}b{k} = I{k}.get({key_source(op.key)})")
            if counting:  # a scan costs its window; a hash probe 1, plus 1 per entry
                lines.append(f"{ind}w{j} += " + (f"len(I{k}.stem)" if op.scan else "1"))
            lines.append(f"{ind}if b{k}:")
            ind += "    "
            if counting and not op.scan:
                lines.append(f"{ind}w{j} += len(b{k})")
            if own:
                lines.append(f"{ind}f{j}_0 += len(b{k})")
            lines.append(f"{ind}for v{k} in b{k}.values():")
        else:
            if counting:
                lines.append(f"{ind}w{j} += len(I{k})")
            if own:
                lines.append(f"{ind}f{j}_0 += len(I{k})")
            lines.append(f"{ind}for v{k} in I{k}.values():")
        return ind + "    "

    def members(slots) -> tuple[str, str]:
        ids = "(" + ", ".join(f"id(v{m})" for m in slots) + ",)"
        comp = "(" + ", ".join(f"v{m}" for m in slots) + ",)"
        return ids, comp

    def cache_names(c: str) -> tuple[str, str, str, int]:
        names[c], names[c + "T"], names[c + "N"] = "cache", "table", "counts"
        return c, c + "T", c + "N", buckets[c]

    def update(op: CacheUpdate, ind: str) -> None:
        c, table, _, nb = cache_names(op.cache)
        ids, comp = members(op.members)
        u = key_source(op.key)
        lines.append(f"{ind}# CacheUpdate {c}" + (" (delete)" if op.delete else ""))
        if op.delete:
            lines.extend([f"{ind}u = {u}", f"{ind}e = {table}[hash(u) % {nb}]",
                      f"{ind}if e is not None and e[0] == u:",
                      f"{ind}    e[1].pop({ids}, None)"])
        elif op.tracked:  # rows that need the reverse map: the method does it
            lines.append(f"{ind}{c}.add({u}, {ids}, {comp})")
        else:  # insert(u, r), inlined: only if the cache holds key u (§3.2)
            lines.extend([f"{ind}u = {u}", f"{ind}e = {table}[hash(u) % {nb}]",
                      f"{ind}if e is not None and e[0] == u:",
                      f"{ind}    e[1][{ids}] = {comp}"])
        charge(ind)

    def observe(op: Observe, ind: str) -> None:
        names[op.name] = "watcher"
        lines.append(f"{ind}{op.name}({key_source(op.key)})")

    def lookup(op: CacheLookup, ind: str) -> str:
        if counting:  # profiled: no caches used, the segment's probes run (App. A)
            lines.append(f"{ind}# {op.cache}'s segment, not looked up (profiling)")
            for sub in op.segment:
                ind = step(sub, ind)
            return ind
        c, table, counts, nb = cache_names(op.cache)
        names["EMPTY"] = "empty"
        segment = "⋈".join(stream_of[p.slot] for p in op.segment if isinstance(p, Probe))
        lines.append(f"{ind}# CacheLookup {c} over {segment}: probe(u); on a miss run the "
                     "segment and create(u, v)")
        # probe(u), inlined; a NULL key joins nothing (an empty hit)
        lines.extend([f"{ind}u = {key_source(op.key)}",
                      f"{ind}if {null_test(op.key)}:", f"{ind}    seg = EMPTY",
                      f"{ind}else:",
                      f"{ind}    e = {table}[hash(u) % {nb}]",
                      f"{ind}    if e is not None and e[0] == u:",
                      f"{ind}        seg = e[1]",
                      f"{ind}        {counts}[0] += 1",
                      f"{ind}    else:",
                      f"{ind}        seg = None",
                      f"{ind}if seg is None:", f"{ind}    seg = {{}}"])
        inner = ind + "    "
        for sub in op.segment:
            inner = step(sub, inner)
        ids, comp = members(op.members)
        lines.append(f"{inner}seg[{ids}] = {comp}")
        # create(u, v), inlined (direct-mapped: replaces the slot's entry); the method is
        # needed only to record rows in the reverse map.
        if op.tracked:
            lines.append(f"{ind}    {c}.create(u, seg)")
        else:
            lines.extend([f"{ind}    if {'u is not None' if len(op.key) == 1 else 'None not in u'}:",
                      f"{ind}        {table}[hash(u) % {nb}] = (u, seg)",
                      f"{ind}    {counts}[1] += 1"])
        lines.append(f"{ind}for {', '.join(f'v{m}' for m in op.members)}, in seg.values():")
        return ind + "    "

    def step(op, ind: str) -> str:
        if isinstance(op, Probe):
            return probe(op, ind)
        if isinstance(op, CacheLookup):
            return lookup(op, ind)
        if isinstance(op, CacheUpdate):
            update(op, ind)
        elif isinstance(op, Observe):
            observe(op, ind)
        elif isinstance(op, Emit):
            sign = "1" if insert else "sign"
            lines.append(f"{ind}emit(({projection_source(query, resolve)}{sign}, ts))")
            if counting:
                lines.append(f"{ind}res += 1")
                charge(ind)
        return ind

    ind = "    "
    for op in plan.ops:
        ind = step(op, ind)
    if plan.kind == "insert":
        names["STEM"], names["emit"] = "stem", "emit"
        lines.append("    STEM.insert(rid, v0, ts)  # an attribute: recompiled per index set")
    if counting:
        def tup(items) -> str:
            return "(" + "".join(f"{x}, " for x in items) + ")"
        fan_out = tup(tup(f"f{j}_{m}" for m in range(len(fans[j]))) for j in range(n)) \
            if fans else "()"
        lines.append(f"    return {tup(f'd{j}' for j in range(n))}, "
                     f"{tup(f'w{j}' for j in range(n))}, {fan_out}, res")
    return "\n".join(lines) + "\n", sorted(names.items())


def compile_plan(query: LogicalQuery, plan: PipelinePlan, bind: Callable[[str, str], object],
                 buckets: Mapping[str, int], counting: bool = False,
                 fans: Sequence[Sequence[Probe]] | None = None) -> Compiled:
    """Compile ``plan`` (its profiled variant with ``counting``); ``bind(name, what)``
    gives the object for each free name (see :func:`generate`)."""
    source, free = generate(query, plan, buckets, counting, fans)
    namespace = {name: bind(name, what) for name, what in free}
    if counting:
        label = plan.name.replace("<pipeline", "<profiled pipeline", 1)
        return compile_source("profile", label, source, namespace)
    return compile_source("pipeline", plan.name, source, namespace)


def compile_source(fn_name: str, label: str, source: str, namespace: dict) -> Compiled:
    """Compile generated ``source`` defining ``fn_name`` (see :func:`exec_source`)."""
    ns, filename = exec_source(label, source, namespace)
    fn = ns[fn_name]
    fn.__source__ = source
    return Compiled(fn, source, filename)


def exec_source(label: str, source: str, namespace: dict) -> tuple[dict, str]:
    """Run generated ``source`` in a copy of ``namespace`` under a filename made of
    ``label`` (``<pipeline ΔR: S⋈T>``) and a digest of the source, registered with
    ``linecache`` so that tracebacks and ``inspect`` show the generated lines. Returns the
    namespace and the filename."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:8]
    stem = label[1:-1] if label.startswith("<") and label.endswith(">") else label
    filename = f"<{stem} {digest}>"
    # mtime None: linecache.checkcache leaves the entry alone (there is no file).
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    code = _code(source, filename)
    ns = {**LITERAL_NAMESPACE, **namespace}  # inline constants: datetime, Decimal
    exec(code, ns)  # noqa: S102 - generated from the parsed query, not from user text
    # A query runs for days and re-plans often: the entry lives as long as a function
    # compiled from it does, so linecache holds the sources in use, not every one ever.
    for fn in [v for v in ns.values() if getattr(v, "__code__", None) is not None
               and v.__code__.co_filename == filename]:
        _LIVE[filename] = _LIVE.get(filename, 0) + 1
        weakref.finalize(fn, _release, filename)
    return ns, filename


_LIVE: dict[str, int] = {}  # linecache filename -> functions alive compiled from it

CODE_CACHE = 256  # code objects of the most recently generated sources kept


@functools.lru_cache(maxsize=CODE_CACHE)
def _code(source: str, filename: str):
    """``compile(source, filename, "exec")``, kept for the next time the same source comes
    back: a re-plan recompiles every pipeline though most are unchanged, and A-Caching's
    observers and trials and A-Greedy's re-orderings toggle plans back and forth (on
    bench.adaptive_ordering's first 16,000 arrivals, 208 compilations, ~115 µs each, a
    fifth of the CPU). Each exec still makes new functions in a new namespace."""
    return compile(source, filename, "exec")


def _release(filename: str) -> None:
    left = _LIVE.get(filename, 1) - 1
    if left > 0:
        _LIVE[filename] = left
    else:
        _LIVE.pop(filename, None)
        linecache.cache.pop(filename, None)
