"""MJoin executor (a-caching.txt §3.1; Viglas et al. [30]).

One pipeline per stream R_i: an order R_i1, ..., R_i(n-1) of the other streams. An update
r in ΔR_i is joined with the other n-1 SteMs in that order, each join probing a hash index
with all predicates between the joined relation and the prefix; the result tuples are
insertions (or deletions) to the n-way join. Then R_i's SteM is updated. No join
subresult is kept, so a pipeline can be re-ordered between any two updates without any
effect on results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter

from adaptcq.engine.compile import compile_function, key_source, probe_plan, projection_source
from adaptcq.query.logical import ColumnRef, LogicalQuery
from adaptcq.state.stem import SteM


def connected_order(query: LogicalQuery, start: str) -> list[str]:
    """A pipeline order that never takes a cartesian product while a stream connected to
    the prefix remains: repeatedly the first stream in FROM order adjacent to the prefix."""
    g = query.join_graph
    prefix, rest = [start], [a for a in query.aliases if a != start]
    while rest:
        nxt = next((a for a in rest if any(g.has_edge(a, p) for p in prefix)), rest[0])
        prefix.append(nxt)
        rest.remove(nxt)
    return prefix[1:]


def check_order(query: LogicalQuery, start: str, order: Sequence[str]) -> list[str]:
    others = sorted(a for a in query.aliases if a != start)
    if sorted(order) != others:
        raise ValueError(
            f"pipeline order for {start} must list each of {', '.join(others)} once, "
            f"got {', '.join(order) or 'nothing'}")
    return list(order)


@dataclass
class Observation:
    """One profiled tuple's trip through its pipeline (a-caching.txt Appendix A).

    ``delta[j]`` is the number of tuples operator j (0-based) processed for it, ``tau[j]``
    the seconds spent there, and ``fanout[j]`` maps every stream not yet joined before
    operator j (the one joined there included) to the number of its tuples that match the
    ``delta[j]`` tuples reaching operator j: the conditional selectivities that A-Greedy's
    greedy invariant is checked against ([5]; join-ordering.txt §3.2).
    """

    stream: str
    order: tuple[str, ...]
    delta: list[int]
    tau: list[float]
    fanout: list[dict[str, int]]
    results: int


class MJoin:
    """The MJoin executor over one SteM per stream.

    ``out`` receives output tuples ``(*select values, sign, ts)``. In append mode deletions
    only update the SteM (expiries emit nothing); in retract mode they run the pipeline
    and emit result deletions.
    """

    name = "mjoin"

    def __init__(self, query: LogicalQuery, mode: str = "append",
                 orders: dict[str, Sequence[str]] | None = None, out: list | None = None):
        self.query = query
        self.retract = mode == "retract"
        self.stems = [SteM(a, query.columns[a]) for a in query.aliases]
        self.out = [] if out is None else out
        self._emit = self.out.append
        self.orders: dict[str, list[str]] = {}
        self._pipelines: list = [None] * len(self.stems)
        self._profile_cache: dict = {}
        for a in query.aliases:
            self.set_order(a, (orders or {}).get(a) or connected_order(query, a))

    # ----- plan ------------------------------------------------------------------------
    def set_order(self, stream: str, order: Sequence[str]) -> None:
        """Re-order ``stream``'s pipeline; valid between any two updates."""
        self.orders[stream] = check_order(self.query, stream, order)
        self._profile_cache.clear()  # it holds index dicts that a re-order may drop
        i = self.query.aliases.index(stream)
        self._pipelines[i] = self._compile(stream, self.orders[stream])
        self._drop_unused_indexes()

    def _compile(self, start: str, order: list[str]):
        """Nested loops over index buckets (see ``engine.compile``)."""
        q = self.query
        var = {start: "v0"}

        def resolve(ref: ColumnRef) -> str:
            return f"{var[ref.stream]}[{q.columns[ref.stream].index(ref.column)}]"

        ns: dict = {}
        lines = ["def pipeline(v0, sign, ts, emit):"]
        ind = "    "
        prefix = [start]
        for k, s in enumerate(order, start=1):
            stem = self.stems[q.aliases.index(s)]
            positions, refs = probe_plan(q, s, prefix)
            if positions:
                ns[f"I{k}"] = stem.index(positions)
                lines.append(f"{ind}b{k} = I{k}.get({key_source(refs, resolve)})")
                lines.append(f"{ind}if b{k}:")
                ind += "    "
                lines.append(f"{ind}for v{k} in b{k}.values():")
            else:  # cartesian product step: only when forced by a given order
                ns[f"R{k}"] = stem.rows
                lines.append(f"{ind}for v{k} in R{k}.values():")
            ind += "    "
            var[s] = f"v{k}"
            prefix.append(s)
        lines.append(f"{ind}emit(({projection_source(q, resolve)} sign, ts))")
        return compile_function("pipeline", lines, ns)

    def _drop_unused_indexes(self) -> None:
        if any(p is None for p in self._pipelines):
            return
        used: dict[str, set] = {a: set() for a in self.query.aliases}
        for start, order in self.orders.items():
            prefix = [start]
            for s in order:
                positions, _ = probe_plan(self.query, s, prefix)
                if positions:
                    used[s].add(positions)
                prefix.append(s)
        for stem in self.stems:
            for positions in stem.indexed:
                if positions not in used[stem.name]:
                    stem.drop_index(positions)

    # ----- updates ---------------------------------------------------------------------
    def insert(self, i: int, rid: int, row: tuple, ts) -> None:
        self._pipelines[i](row, 1, ts, self._emit)
        self.stems[i].insert(rid, row)

    def delete(self, i: int, rid: int, ts) -> None:
        row = self.stems[i].delete(rid)
        if self.retract:
            self._pipelines[i](row, -1, ts, self._emit)

    # ----- profiling (the mechanism; statistics and policies live in stats/ and adapt/) --
    def profile_insert(self, i: int, rid: int, row: tuple, ts, fanouts: bool = True) -> Observation:
        """Process an insertion fully, breadth-first, measuring each operator.

        Gives the same output as ``insert``; slower, so drivers use it for a sample of
        tuples only (a-caching.txt App. A: profile with probability p_i, no caches used)."""
        obs = self._profiled(i, row, 1, ts, fanouts)
        self.stems[i].insert(rid, row)
        return obs

    def _profiled(self, i: int, row: tuple, sign: int, ts, fanouts: bool) -> Observation:
        q = self.query
        start = q.aliases[i]
        order = self.orders[start]
        steps, project = self._profile_plan(start)
        level = [(row,)]
        delta, tau, fan = [], [], []
        remaining = list(order)
        for k, (stem, idx, keyfn) in enumerate(steps):
            if fanouts:
                fan.append(self._fanouts(level, start, order[:k], remaining))
            t0 = perf_counter()
            nxt = []
            if idx is None:
                rows = stem.rows.values()
                for comp in level:
                    nxt.extend([comp + (v,) for v in rows])
            else:
                for comp in level:
                    key = keyfn(comp)
                    b = idx.get(key) if key is not None else None
                    if b:
                        nxt.extend([comp + (v,) for v in b.values()])
            tau.append(perf_counter() - t0)
            delta.append(len(level))
            remaining.pop(0)
            level = nxt
        for comp in level:
            project(comp, sign, ts, self._emit)
        return Observation(start, tuple(order), delta, tau, fan, len(level))

    def _profile_plan(self, start: str):
        """Per operator: (SteM, index or None for a cartesian step, key of a composite),
        and the projection of a full composite (in pipeline order)."""
        cached = self._profile_cache.get(start)
        order = tuple(self.orders[start])
        if cached is not None and cached[0] == order:
            return cached[1], cached[2]
        q = self.query
        prefix = [start]
        steps = []
        for s in order:
            positions, refs = probe_plan(q, s, prefix)
            stem = self.stems[q.aliases.index(s)]
            slots = [(prefix.index(r.stream), q.columns[r.stream].index(r.column)) for r in refs]
            steps.append((stem, stem.index(positions) if positions else None, _comp_key(slots)))
            prefix.append(s)

        def resolve(ref: ColumnRef) -> str:
            return f"c[{prefix.index(ref.stream)}][{q.columns[ref.stream].index(ref.column)}]"

        project = compile_function("project", [
            "def project(c, sign, ts, emit):",
            f"    emit(({projection_source(q, resolve)} sign, ts))"], {})
        self._profile_cache[start] = (order, steps, project)
        return steps, project

    def _fanouts(self, level, start, joined, remaining) -> dict[str, int]:
        """Matches of each remaining stream for the tuples at this point of the pipeline."""
        q = self.query
        prefix = [start, *joined]
        out = {}
        for s in remaining:
            positions, refs = probe_plan(q, s, prefix)
            stem = self.stems[q.aliases.index(s)]
            if not positions:
                out[s] = len(stem) * len(level)
                continue
            idx = stem.index(positions)
            keyfn = _comp_key([(prefix.index(r.stream), q.columns[r.stream].index(r.column))
                               for r in refs])
            n = 0
            for comp in level:
                key = keyfn(comp)
                b = idx.get(key) if key is not None else None
                if b:
                    n += len(b)
            out[s] = n
        return out

    # ----- checkpoints -----------------------------------------------------------------
    def plan_state(self) -> dict:
        return {"orders": {a: list(o) for a, o in self.orders.items()}}

    def load(self, i: int, rows: dict) -> None:
        """Restore stream i's window contents (rid -> row) without producing output."""
        stem = self.stems[i]
        for rid, row in rows.items():
            stem.insert(rid, row)

    # ----- introspection ---------------------------------------------------------------
    def state_tuples(self) -> int:
        return sum(len(s) for s in self.stems)

    def state_bytes(self) -> int:
        return sum(s.size_bytes() for s in self.stems)

    def describe(self) -> str:
        return "\n".join(f"ΔR {s}: " + " ⋈ ".join(o) for s, o in self.orders.items())


def _comp_key(slots: list[tuple[int, int]]):
    """Key of a composite tuple (rows in pipeline order) from (slot, column) pairs."""
    if len(slots) == 1:
        (a, c), = slots
        return lambda comp: comp[a][c]

    def key(comp, _slots=tuple(slots)):
        k = tuple(comp[a][c] for a, c in _slots)
        return None if None in k else k
    return key
