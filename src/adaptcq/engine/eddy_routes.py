"""Compiled eddy routes: the routing table of one routing epoch, compiled to Python.

cacq.txt §4 routes every tuple by a lottery; ``adapt.routing.RoutingTable`` is the coarser
alternative the issue asks to measure: the policy writes, once per *routing epoch*, an
order of the SteM accesses of every virtual source, and every tuple of that epoch follows
it. An order that is fixed for a while can be compiled, like an MJoin pipeline
(``engine.codegen``): one function per (singleton virtual source, insertion or deletion)
that routes the tuple and every intermediate tuple it produces depth-first, with the
readiness tests, the sequence rule, the pass masks, the visibility test and each group's
window test inlined, and the components kept in local variables (no per-tuple dict).

The semantics are the interpreted router's (``Eddy._route``): a SteM access is ready when
the tuple's query mask meets its ``needs``; visiting it hands those queries to the
intermediate tuples. Only the order among ready SteMs is the table's. The policy still
learns: the functions count, per SteM access, the tuples it consumed and returned, and the
eddy reports them at the end of the epoch.

Generated code is deterministic (names from positions), shown by
``adaptcq explain --executor eddy --code``, and registered in ``linecache`` under
``<eddy route R#0 1a2b3c4d>``, so a traceback points at the generated line.
"""

from __future__ import annotations

from adaptcq.engine.continuous import NAN_KINDS  # (a decimal, string, ... key pays no NaN test)

MAX_BLOCKS = 256   # inline blocks per route; beyond, the eddy interprets (a wide query set)


class TooLarge(Exception):
    """The route would inline more than MAX_BLOCKS blocks."""




def nan_checks(eddy, probe) -> tuple[int, ...]:
    """The elements of a group's probe key (``Group.probe``: per column (component,
    position)) that may be NaN. A NaN key joins nothing (docs/semantics.md), but a dict
    lookup matches the very NaN object stored in the index by identity: in a self-join a
    row's probe key *is* its own stored key. The probes (compiled here, interpreted in
    ``Eddy._probe``) test only these elements, only after a hit (a miss pays nothing)."""
    out = []
    for i, ((src, _role), p) in enumerate(probe):
        column = eddy.sources[src].columns[p]
        if eddy.schemas.get(src, {}).get(column, "other") in NAN_KINDS:
            out.append(i)
    return tuple(out)


def route_source(eddy, start: tuple[str, int], deletion: bool, orders: dict
                 ) -> tuple[str, dict]:
    """Python source of the route of singletons of ``start`` and its namespace.

    ``orders`` maps a virtual source id to its SteM access ids in the table's order.
    The function is ``route(c0, hi, m, sign, ts)``: c0 the row, hi its sequence number, m
    its query mask.
    """
    gen = _Gen(eddy, deletion, orders)
    vs = eddy.vsource(frozenset((start,)))
    gen.lines = ["def route(c0, hi, m, sign, ts):", "    ev_t, ev_e = EV"]
    if deletion:
        gen.lines.append("    cur_src, cur_k, cur_del, cur_rid = CUR")
    gen.block(vs, {start: "c0"}, "m", 1, 0, "hi")
    return "\n".join(gen.lines) + "\n", gen.ns


class _Gen:
    def __init__(self, eddy, deletion: bool, orders: dict):
        self.eddy = eddy
        self.deletion = deletion
        self.orders = orders
        self.lines: list[str] = []
        self.ns: dict = {"EV": eddy._ev, "CUR": eddy._cur_list, "N_IN": eddy._n_in,
                         "N_OUT": eddy._n_out, "VIS": eddy.visible, "LAST": eddy.last_reg,
                         "BYBIT": eddy.by_bit, "INW": eddy._in_windows,
                         "HELD": eddy.held_only}
        self.names: dict[int, str] = {}
        self.blocks = 0

    def const(self, value, prefix: str) -> str:
        """A namespace name for an object (deterministic: by first use)."""
        key = id(value)
        name = self.names.get(key)
        if name is None:
            name = self.names[key] = f"{prefix}{len(self.names)}"
            self.ns[name] = value
        return name

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def block(self, vs, comps: dict, m: str, depth: int, level: int, hi: str) -> None:
        """The code routing a tuple of ``vs`` whose mask is in variable ``m`` (``hi``: the
        variable holding its newest component's sequence number)."""
        self.blocks += 1
        if self.blocks > MAX_BLOCKS:
            raise TooLarge
        e = self.emit
        if vs.complete:
            args = ", ".join(comps[key] for key in sorted(vs.key))
            e(depth, f"out = {m} & {vs.complete}")
            e(depth, "if out:")
            e(depth + 1, f"{m} ^= out")
            seers = self.eddy._seers_mask & vs.complete
            if self.deletion and seers:
                # A result of rows held before a start="window" query is not its to retract.
                e(depth + 1, f"if out & {seers}:")
                e(depth + 2, f"out &= ~HELD({hi})")
            e(depth + 1, "while out:")
            e(depth + 2, "low = out & -out")
            e(depth + 2, "q = BYBIT[low.bit_length() - 1]")
            e(depth + 2, f"q.emit((*q.project_at({args}), sign, ts))")
            e(depth + 2, "q.emitted += 1")
            e(depth + 2, "out ^= low")
        targets = {t.id: t for t in vs.targets}
        order = [tid for tid in self.orders.get(vs.id, ()) if tid in targets]
        order += [t.id for t in vs.targets if t.id not in order]
        for tid in order:
            t = targets[tid]
            h = f"h{level}"
            e(depth, f"{h} = {m} & {t.needs}")
            e(depth, f"if {h}:")
            e(depth + 1, f"{m} ^= {h}")
            e(depth + 1, f"N_IN[{tid}] += 1")
            self.probe(vs, t, comps, h, depth + 1, level, hi)

    def probe(self, vs, t, comps: dict, h: str, depth: int, level: int, hi: str) -> None:
        e = self.emit
        eddy = self.eddy
        src, k = t.source, t.role
        st = eddy.sources[src]
        vs2 = vs.nexts.get(t.id)
        if vs2 is None:
            vs2 = vs.nexts[t.id] = eddy.vsource(vs.key | {(src, k)})
        passed = self.const(st.passed, "PASSED")
        times = self.const(st.stem.times, "TIMES")
        shift = k * eddy.capacity
        r, c, mm = f"r{level + 1}", f"c{level + 1}", f"m{level + 1}"
        for g in t.groups:
            d = depth
            hg = h
            if g.mask & t.needs != t.needs:
                hg = f"g{level}"
                e(d, f"{hg} = {h} & {g.mask}")
                e(d, f"if {hg}:")
                d += 1
            if len(g.probe) == 1:
                (comp, p), = g.probe
                e(d, f"key = {comps[comp]}[{p}]")
                e(d, "if key is not None:")
                nans = "".join(" and key == key" for _ in g.nan)   # (not NaN)
            else:
                parts = "".join(f"{comps[comp]}[{p}], " for comp, p in g.probe)
                e(d, f"key = ({parts})")
                e(d, "if None not in key:")
                nans = "".join(f" and key[{i}] == key[{i}]" for i in g.nan)
            idx = self.const(g.index, "IDX")
            e(d + 1, f"b = {idx}.get(key)")
            # A NaN key finds only its own stored object (nan_checks): tested on a hit.
            e(d + 1, f"if b{nans}:")
            d += 2
            e(d, f"for {r}, {c} in b.items():")
            d += 1
            e(d, f"eff = {r} * 8 + {k}")
            if not self.deletion:
                e(d, "if eff >= hi:")
                e(d + 1, "continue")
            else:
                e(d, f"if cur_src == {src!r} and {r} == cur_rid and {k} >= cur_k:")
                e(d + 1, "continue")
            e(d, f"{mm} = {hg} & ({passed}[{r}] >> {shift})" if shift else
              f"{mm} = {hg} & {passed}[{r}]")
            e(d, f"if not {mm}:")
            e(d + 1, "continue")
            e(d, f"if {r} <= LAST:")
            e(d + 1, f"{mm} &= VIS({r})")
            windows = g.windows
            if len(windows) == 1 and windows[0][0] == "range":
                e(d, f"end = {times}[{r}] + {windows[0][1]!r}")
                e(d, "if end < ev_t or end == ev_t and eff <= ev_e:")
                e(d + 1, "continue")
            elif not (len(windows) == 1 and windows[0][0] == "unbounded"):
                stn = self.const(st, "ST")
                wn = self.const(windows, "W")
                e(d, f"{mm} &= INW({wn}, {mm}, {stn}, {r}, eff, ev_t, ev_e, "
                     f"cur_src == {src!r}, {k}, cur_k, cur_del)" if self.deletion else
                     f"{mm} &= INW({wn}, {mm}, {stn}, {r}, eff, ev_t, ev_e, "
                     f"CUR[0] == {src!r}, {k}, CUR[1], CUR[2])")
                e(d, f"if not {mm}:")
                e(d + 1, "continue")
            e(d, f"N_OUT[{t.id}] += 1")
            hi2 = hi
            if self.deletion and self.eddy._seers_mask:
                hi2 = f"hi{level + 1}"
                e(d, f"{hi2} = eff if eff > {hi} else {hi}")
            self.block(vs2, {**comps, (src, k): c}, mm, d, level + 1, hi2)
