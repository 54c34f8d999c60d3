"""The cache-selection model of A-Caching (a-caching.txt §3.2, §4.1, §4.4, Appendix B).

A *candidate* is a cache C_ijk over the contiguous segment of join operators
⋈_{i_j} .. ⋈_{i_k} of ΔR_i's pipeline (§3.2; positions are 1-based, inclusive). Its
*estimate* carries benefit(C) and cost(C) of §4.1, and the processing cost d_ij·c_ij of
every pipeline operator is given separately as ``operator_costs[(pipeline, position)]``.

Two equivalent objectives over a set X of nonoverlapping candidates (§4.2, §4.4):

* **net benefit** ``Σ_{C∈X} benefit(C) − Σ_{groups r touched by X} L_r``: the §4.2
  objective with Def. 4.1's sharing — the caches of one shared group pay their common
  maintenance cost L_r once (§4.4, "the total cost is simply the cost of a single cache");
* **total cost** (Appendix B's integer program) ``Σ_{C∈X} proc(C) + Σ_{operators not covered}
  d·c + Σ_{groups r touched by X} L_r`` where ``proc(C) = Σ_{l=j..k} d_il c_il − benefit(C)``
  (§4.4: benefit is the processing cost without the cache minus with it).

Hence ``total_cost(X) = Σ_{all operators} d·c − net_benefit(X)``: maximizing one is
minimizing the other, exactly, for every X.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from adaptcq.query.logical import ColumnRef

Kind = Literal["prefix", "global"]
Operator = tuple[str, int]
"""One join operator ⋈_{i_j}: (the pipeline's stream R_i, its 1-based position j)."""
Group = tuple[frozenset[str], frozenset[ColumnRef], frozenset[str]]
"""The sharing key of Def. 4.1: (segment as a set, cache key, Y of a §6 cache)."""

_TOL = 1e-9


def natural_key(name: str) -> tuple:
    """Sort ``R2`` before ``R10``: digits compare as numbers."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def _ref_key(ref: ColumnRef) -> tuple:
    return natural_key(ref.stream), natural_key(ref.column)


@dataclass(frozen=True)
class Candidate:
    """A candidate cache C_ijk (§3.2, Table 1).

    - ``pipeline``: R_i, the stream whose pipeline ΔR_i holds the cache;
    - ``start``, ``end``: j and k, the 1-based positions of ⋈_{i_j} and ⋈_{i_k} (inclusive);
    - ``segment``: {R_{i_j}, .., R_{i_k}};
    - ``key``: K_ijk, the segment-side columns joined to the streams before the segment
      (R_i, R_{i_1}, .., R_{i_{j-1}}), one per attribute class (``engine.rules.cache_key``,
      the columns the executor keys the cache by); the segment side is what identifies the
      cached content across pipelines (Def. 4.1);
    - ``kind``: ``"prefix"`` for a cache satisfying the prefix invariant (Def. 3.2), or
      ``"global"`` for a globally-consistent cache X ⋈ Y of §6 (Def. 6.1) where X is the
      segment and ``extra`` is Y (nonempty, disjoint from X, X ∪ Y satisfies Def. 3.2).
    """

    pipeline: str
    start: int
    end: int
    segment: frozenset[str]
    key: frozenset[ColumnRef]
    kind: Kind = "prefix"
    extra: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.start < 1 or self.end < self.start:
            raise ValueError(f"cache positions must satisfy 1 <= start <= end, got "
                             f"{self.start}..{self.end}")
        if len(self.segment) != self.end - self.start + 1:
            raise ValueError(f"segment {sorted(self.segment)} does not have "
                             f"{self.end - self.start + 1} relations (positions "
                             f"{self.start}..{self.end})")
        if self.pipeline in self.segment:
            raise ValueError(f"a cache in ΔR {self.pipeline}'s pipeline cannot contain "
                             f"{self.pipeline} in its segment")
        if self.kind == "prefix" and self.extra:
            raise ValueError("a prefix-invariant cache has no extra relations Y (§6)")
        if self.kind == "global" and not self.extra:
            raise ValueError("a globally-consistent cache X ⋈ Y needs a nonempty Y (§6)")
        if self.kind not in ("prefix", "global"):
            raise ValueError(f"kind must be 'prefix' or 'global', got {self.kind!r}")
        if self.extra & self.segment:
            raise ValueError("Y must be disjoint from the cached segment X (§6)")

    @property
    def operators(self) -> tuple[Operator, ...]:
        """The operators ⋈_{i_j}, .., ⋈_{i_k} the cache spans (and bypasses on a hit)."""
        return tuple((self.pipeline, p) for p in range(self.start, self.end + 1))

    @property
    def length(self) -> int:
        """n_c of Appendix B: the number of operators the cache covers."""
        return self.end - self.start + 1

    @property
    def group(self) -> Group:
        """Def. 4.1: caches in different pipelines that cache the same join (the segment as
        a set) with the same key are shared; a §6 cache also needs the same Y."""
        return self.segment, self.key, self.extra

    @property
    def name(self) -> str:
        seg = "⋈".join(sorted(self.segment, key=natural_key))
        if self.extra:
            seg = f"({seg})⋈" + "⋈".join(sorted(self.extra, key=natural_key))
        key = ",".join(str(r) for r in sorted(self.key, key=_ref_key))
        return f"C[{self.pipeline}: {seg} | key {key}]"

    def overlaps(self, other: Candidate) -> bool:
        """True when both caches are in one pipeline and share an operator (§4.2)."""
        return (self.pipeline == other.pipeline and self.start <= other.end
                and other.start <= self.end)

    def __str__(self) -> str:
        return self.name


def group_name(group: Group) -> str:
    segment, key, extra = group
    seg = "⋈".join(sorted(segment, key=natural_key))
    if extra:
        seg = f"({seg})⋈" + "⋈".join(sorted(extra, key=natural_key))
    return f"{seg} | key " + ",".join(str(r) for r in sorted(key, key=_ref_key))


@dataclass(frozen=True)
class Estimate:
    """benefit(C) and cost(C) of §4.1, per unit time.

    ``cost`` is the maintenance cost; for a shared group (Def. 4.1) every member carries
    the same value, the group's one common cost L_r (Appendix B)."""

    benefit: float
    cost: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.benefit) and math.isfinite(self.cost)):
            raise ValueError(f"benefit and cost must be finite, got {self.benefit}, {self.cost}")
        if self.cost < 0:
            raise ValueError(f"a maintenance cost per unit time cannot be negative: {self.cost}")


def segment_cost(candidate: Candidate, operator_costs: Mapping[Operator, float]) -> float:
    """Σ_{l=j..k} d_il c_il: the segment's processing cost per unit time without the cache."""
    try:
        return math.fsum(operator_costs[op] for op in candidate.operators)
    except KeyError as e:
        raise ValueError(f"operator_costs has no entry for operator {e.args[0]} of "
                         f"{candidate.name}") from None


def proc(candidate: Candidate, estimate: Estimate,
         operator_costs: Mapping[Operator, float]) -> float:
    """proc(C_ijk) of §4.4 (B_c of Appendix B): the processing cost per unit time of the
    pipeline segment when the cache is used, maintenance excluded. By §4.1/§4.4,
    benefit = Σ_{l=j..k} d_il c_il − proc, so proc = Σ d c − benefit."""
    return segment_cost(candidate, operator_costs) - estimate.benefit


def is_nonoverlapping(chosen: Iterable[Candidate]) -> bool:
    """No two chosen caches in one pipeline share an operator position (§4.2)."""
    used: set[Operator] = set()
    for c in chosen:
        ops = set(c.operators)
        if ops & used:
            return False
        used |= ops
    return True


def shared_groups(candidates: Iterable[Candidate]) -> dict[Group, list[Candidate]]:
    """The maximal groups G_1..G_k of shared candidates (Def. 4.1, Appendix B), each listed
    in input order. A group of one is an unshared cache."""
    groups: dict[Group, list[Candidate]] = defaultdict(list)
    for c in candidates:
        groups[c.group].append(c)
    return dict(groups)


def group_costs(candidates: Iterable[Candidate],
                estimates: Mapping[Candidate, Estimate]) -> dict[Group, float]:
    """L_r per group: the common maintenance cost of Appendix B. Raises ValueError when
    the members of one group disagree (their cost is the cost of one shared cache)."""
    out: dict[Group, float] = {}
    first: dict[Group, Candidate] = {}
    for c in candidates:
        est = _estimate(c, estimates)
        g = c.group
        if g not in out:
            out[g], first[g] = est.cost, c
        elif abs(out[g] - est.cost) > _TOL * max(1.0, abs(out[g])):
            raise ValueError(
                f"shared caches {first[g].name} and {c.name} have different costs "
                f"{out[g]} and {est.cost}; a shared group has one maintenance cost L_r "
                f"(Def. 4.1, Appendix B)")
    return out


def net_benefit(chosen: Iterable[Candidate], estimates: Mapping[Candidate, Estimate]) -> float:
    """Σ_{C∈X} benefit(C) − Σ_{groups touched by X} L_r (§4.2 with §4.4's sharing)."""
    chosen = list(chosen)
    costs = group_costs(chosen, estimates)
    return math.fsum(_estimate(c, estimates).benefit for c in chosen) - math.fsum(costs.values())


def total_cost(chosen: Iterable[Candidate], estimates: Mapping[Candidate, Estimate],
               operator_costs: Mapping[Operator, float]) -> float:
    """Appendix B's objective Σ_{c∈X} B_c + Σ_r L_r z_r with every operator not covered by a
    chosen cache counted as its own zero-length cache (proc = d·c, cost 0; §4.4)."""
    chosen = list(chosen)
    if not is_nonoverlapping(chosen):
        raise ValueError("total cost is defined for nonoverlapping caches only (§4.2)")
    covered = {op for c in chosen for op in c.operators}
    missing = covered - operator_costs.keys()
    if missing:
        raise ValueError(f"operator_costs has no entry for operators {sorted(missing)}")
    plain = math.fsum(v for op, v in operator_costs.items() if op not in covered)
    used = math.fsum(proc(c, _estimate(c, estimates), operator_costs) for c in chosen)
    return plain + used + math.fsum(group_costs(chosen, estimates).values())


def check_instance(candidates: Iterable[Candidate], estimates: Mapping[Candidate, Estimate],
                   operator_costs: Mapping[Operator, float]) -> list[Candidate]:
    """Validate a selection instance; return the candidates as a list without duplicates.

    Every candidate needs an estimate and a d·c for each of its operators, the members of
    a shared group one common cost, and one group no two members in one pipeline."""
    out = list(dict.fromkeys(candidates))
    for c in out:
        _estimate(c, estimates)
        segment_cost(c, operator_costs)
    group_costs(out, estimates)
    for g, members in shared_groups(out).items():
        pipes = [c.pipeline for c in members]
        if len(set(pipes)) != len(pipes):
            raise ValueError(f"shared group {group_name(g)} has two caches in one pipeline")
    for op, v in operator_costs.items():
        if not math.isfinite(v):
            raise ValueError(f"operator cost d·c of {op} must be finite, got {v}")
    return out


def _estimate(c: Candidate, estimates: Mapping[Candidate, Estimate]) -> Estimate:
    try:
        return estimates[c]
    except KeyError:
        raise ValueError(f"no estimate for candidate {c.name}") from None


@dataclass(frozen=True)
class Selection:
    """A chosen set of nonoverlapping caches with both objective values.

    ``lower_bound`` is set by the LP algorithm (the optimum of the relaxation, a lower
    bound on the optimal total cost; Appendix B), ``integral`` when that LP optimum was
    already integral (then the selection is optimal)."""

    chosen: frozenset[Candidate]
    net_benefit: float
    total_cost: float
    method: str
    lower_bound: float | None = None
    integral: bool | None = None

    @classmethod
    def of(cls, chosen: Iterable[Candidate], estimates: Mapping[Candidate, Estimate],
           operator_costs: Mapping[Operator, float], method: str,
           lower_bound: float | None = None, integral: bool | None = None) -> Selection:
        chosen = frozenset(chosen)
        return cls(chosen, net_benefit(chosen, estimates),
                   total_cost(chosen, estimates, operator_costs), method, lower_bound,
                   integral)

    @property
    def names(self) -> list[str]:
        """The chosen caches' names, sorted by pipeline then position."""
        return [c.name for c in sorted(self.chosen, key=sort_key)]


def sort_key(c: Candidate) -> tuple:
    """A deterministic order: pipeline (natural order), start, end, kind, name."""
    return natural_key(c.pipeline), c.start, c.end, c.kind, c.name


def resolve_overlaps(picked: Iterable[Candidate]) -> list[Candidate]:
    """Appendix B: "if a set of caches overlap, we choose the one that covers the most
    operators, and drop the rest". Larger caches first (ties: earlier in ``picked``); a cache
    is kept when it overlaps none kept before it."""
    picked = list(dict.fromkeys(picked))
    order = sorted(range(len(picked)), key=lambda i: (-picked[i].length, i))
    kept: list[Candidate] = []
    used: set[Operator] = set()
    for i in order:
        ops = set(picked[i].operators)
        if not ops & used:
            kept.append(picked[i])
            used |= ops
    return kept


# ----- per-operation costs: §4.1's benefit and cost in the engine's terms --------------------
@dataclass(frozen=True)
class OpCosts:
    """The cost of one operation of each kind, in the model's unit (§4.3: probe_cost and
    update_cost "derived from the cache implementation"; Appendix A: c_ij).

    Two clocks (``clock``):

    * ``"work"``: the engine's counted work units (``engine.interp``): a hash probe, a
      bucket entry, a scanned row, a cache probe (``probe_cost``) and a tuple stored in a
      cache or maintained (``update_cost``) cost 1 unit each, the rest 0; deterministic
      (``--no-cache-verify`` runs the paper's policy on it).
    * ``"seconds"``: CPU seconds per operation measured on the compiled pipelines as they
      run (``stats.costs``; issue 14, item 1), with the terms the work clock leaves out:
      the entry's tuples yielded on a hit (``cache_yield``), an entry built on a miss
      (``entry_build``), deletions running the pipeline in retract mode (``runs`` pipeline
      runs per insertion) and maintaining the cache in both modes (``maintains``), and
      every arrival's fixed work (``insert``, ``expiry``), which no cache changes but
      which the predicted CPU ratio of a plan must include."""

    probe: float
    entry: float
    scan_row: float
    cache_probe: float
    cache_yield: float
    cache_store: float
    entry_build: float
    cache_update: float
    insert: float = 0.0
    expiry: float = 0.0
    runs: float = 1.0
    maintains: float = 1.0
    observe: float = 0.0
    clock: str = "work"

    @classmethod
    def work_clock(cls, probe_cost: float = 1.0, update_cost: float = 1.0) -> OpCosts:
        """§4.1 on the work clock, exactly as before per-operation rates: probe_cost per
        cache probe, update_cost per tuple stored on a miss and per CacheUpdate."""
        return cls(1.0, 1.0, 1.0, probe_cost, 0.0, update_cost, 0.0, update_cost)

    @classmethod
    def measured(cls, seconds: Mapping[str, float], *, retract: bool,
                 probe_cost: float = 1.0, update_cost: float = 1.0) -> OpCosts:
        """From measured seconds per operation kind (``stats.costs.CostFit.seconds``).
        ``probe_cost`` and ``update_cost`` (1 by default) scale the measured cost of a
        cache probe, and of storing and maintaining cached tuples."""
        s = seconds
        return cls(s["probe"], s["entry"], s["scan_row"], s["cache_probe"] * probe_cost,
                   s["entry"], s["entry"] * update_cost, s["entry_build"] * update_cost,
                   s["cache_update"] * update_cost, s["insert"], s["expiry"],
                   runs=2.0 if retract else 1.0, maintains=2.0, observe=s.get("observe", 0.0),
                   clock="seconds")


def operator_cost(d: float, per_tuple: tuple[float, float, float], costs: OpCosts) -> float:
    """d_ij·c_ij of §4.1 (Appendix A) with c_ij from its operations: ``per_tuple`` is
    (hash probes, bucket entries, scanned rows) per tuple reaching the operator, each at
    its cost, times the pipeline runs per insertion (``costs.runs``)."""
    probes, entries, rows = per_tuple
    return d * costs.runs * (probes * costs.probe + entries * costs.entry
                             + rows * costs.scan_row)


def cache_estimate(seg: float, d_in: float, d_out: float, miss: float, ups: Iterable[float],
                   costs: OpCosts, maintain_joins: float = 0.0) -> Estimate:
    """benefit(C_ijk) and cost(C_ijk) of §4.1:

        benefit = Σ_{l=j..k} d_il·c_il − d_ij·probe_cost − miss·(Σ_{l=j..k} d_il·c_il
                  + d_{i,k+1}·update_cost)
        cost    = update_cost · Σ_{R_l ∈ Z} d_{l,|Z|-1}

    ``seg`` = Σ d_il·c_il (``operator_cost``), ``d_in`` = d_ij and ``d_out`` = d_{i,k+1}
    (tuples per unit time reaching and leaving the segment), ``ups`` the d_{l,|Z|-1}.
    probe_cost is ``costs.cache_probe``, update_cost ``costs.cache_store`` in the benefit
    (a tuple stored on a miss) and ``costs.cache_update`` in the cost (a tuple passing a
    CacheUpdate). Beyond the paper, on the measured clock: a hit yields the entry's
    d_{i,k+1}/d_ij tuples (``cache_yield`` each), a miss builds an entry
    (``entry_build``), deletions probe the cache as insertions do in retract mode
    (``runs``) and maintain it in both (``maintains``), and ``maintain_joins`` (seconds per
    unit time) is the work of the joins that append-mode deletions run only to reach the
    CacheUpdates. On the work clock these extra terms are 0 and the formulas are the
    paper's."""
    f = costs.runs
    benefit = (seg - f * d_in * costs.cache_probe - f * (1.0 - miss) * d_out * costs.cache_yield
               - miss * (seg + f * (d_out * costs.cache_store + d_in * costs.entry_build)))
    cost = costs.maintains * costs.cache_update * math.fsum(ups) + maintain_joins
    return Estimate(benefit, cost)
