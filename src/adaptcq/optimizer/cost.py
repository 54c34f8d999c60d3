"""The per-unit-time CPU cost model of join-ordering.txt §2.2 (Eq. 1–3).

A pipeline of ΔS_start (§2.1, Fig. 2.b) is an order ⋈_{start:1}, …, ⋈_{start:n-1} of the
other streams. Write P_0 = λ_start and, after the i-th stream S_{start:i} joins,

    P_i = P_{i-1} · (λ_{start:i} · W) · σ_{start:i}

where σ_{start:i} is the product of σ over every predicate between S_{start:i} and the streams
already in the prefix (start included), 1 when there is none (a cartesian product). P_i is
the number of composite tuples per unit time the i-th join produces. Then

* Eq. 2 — ``pipeline_cost``: λ_start·C_insert + λ_start·C_delete
  + Σ_{i=1}^{n-1} P_{i-1} · (λ_{start:i} · W) · C_join
  (each of the P_{i-1} probing tuples scans the state ST of S_{start:i}, which holds λ·W tuples;
  this is λ_start[C_insert + C_delete + Σ_i (Π_{j≤i} λ_{start:j} σ_{start:j-1}) W^i C_join]
  with σ_{start:0} = 1);
* Eq. 3 — ``plan_cost``: the sum of Eq. 2 over the pipelines of all n streams;
* §3.1 / §4 — ``intermediate_tuples``: Σ_{i=1}^{n-1} P_i, the join results the pipeline
  produces per unit time. It is λ_start · C(ζ) for the recursive cost C of §4 with
  C(⋈_{start:i}) = T(⋈_{start:i}) = λσW, the quantity DMJoin (§3.1) and F-Greedy (§3.2) are
  described as minimizing. Its last term, P_{n-1}, is the query's output rate and does not
  depend on the order.

The two objectives are not the same function of the order: the order-dependent part of Eq. 2
is Σ_i P_i/σ_{start:i}, the paper's §4 recursion counts Σ_i P_i. Every algorithm that
optimizes takes ``objective="cost"`` (Eq. 2–3, the default) or ``objective="tuples"``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from adaptcq.engine import rules
from adaptcq.optimizer.graph import JoinGraph, OptimizerError

Objective = Literal["cost", "tuples"]
OBJECTIVES: tuple[Objective, ...] = ("cost", "tuples")


def check_objective(objective: str) -> Objective:
    if objective not in OBJECTIVES:
        raise OptimizerError(f"unknown objective {objective!r}; choose one of "
                             f"{', '.join(OBJECTIVES)}")
    return objective  # type: ignore[return-value]


def check_order(graph: JoinGraph, start: str, order: Sequence[str]) -> None:
    """Raise unless ``order`` lists every stream other than ``start`` exactly once (the
    rule of ``engine.rules.check_order``, with the optimizer's messages)."""
    if start not in graph.rates:
        raise OptimizerError(f"unknown start stream {start!r} "
                             f"(streams: {', '.join(graph.streams)})")
    try:
        rules.check_order(graph.streams, start, order)
    except ValueError:
        others = set(graph.streams) - {start}
        raise OptimizerError(f"the pipeline of {start!r} must list each of "
                             f"{sorted(others)} exactly once, got {list(order)}") from None


def join_factor(graph: JoinGraph, prefix: Iterable[str], s: str) -> float:
    """λ_s · W · σ_s, with σ_s the product of σ between ``s`` and each stream of ``prefix``
    that shares a predicate with it: how many times more tuples leave the join with ``s``
    than enter it (the per-step factor of Eq. 2)."""
    sigma = 1.0
    prefix_set = prefix if isinstance(prefix, (set, frozenset)) else set(prefix)
    for t, st in graph.neighbor_selectivities(s):
        if t in prefix_set:
            sigma *= st
    return graph.rates[s] * graph.window * sigma


def prefix_rates(graph: JoinGraph, start: str, order: Sequence[str]) -> list[float]:
    """[P_0, P_1, …, P_{n-1}]: tuples per unit time leaving each step of the pipeline
    (P_0 = λ_start, the new tuples of ΔS_start; §2.2)."""
    check_order(graph, start, order)
    sizes = [graph.rates[start]]
    prefix = {start}
    for s in order:
        sizes.append(sizes[-1] * join_factor(graph, prefix, s))
        prefix.add(s)
    return sizes


def pipeline_cost(graph: JoinGraph, start: str, order: Sequence[str]) -> float:
    """Eq. 2 (and Eq. 1): CPU cost per unit time of processing ΔS_start along ``order``:
    λ·C_insert + λ·C_delete + Σ_{i=1}^{n-1} P_{i-1}·(λ_{start:i}·W)·C_join."""
    sizes = prefix_rates(graph, start, order)
    lam = sizes[0]
    probe = sum(p * graph.rates[s] * graph.window for p, s in zip(sizes, order, strict=False))
    return lam * graph.c_insert + lam * graph.c_delete + probe * graph.c_join


def intermediate_tuples(graph: JoinGraph, start: str, order: Sequence[str]) -> float:
    """§3.1/§4: Σ_{i=1}^{n-1} P_i, the join results per unit time the pipeline produces
    (= λ_start·C(ζ) with the §4 recursion C(⋈) = T(⋈) = λσW)."""
    return sum(prefix_rates(graph, start, order)[1:])


def pipeline_objective(graph: JoinGraph, start: str, order: Sequence[str],
                       objective: Objective = "cost") -> float:
    """``pipeline_cost`` (objective "cost") or ``intermediate_tuples`` ("tuples")."""
    if check_objective(objective) == "cost":
        return pipeline_cost(graph, start, order)
    return intermediate_tuples(graph, start, order)


def _check_plan(graph: JoinGraph, plan: Mapping[str, Sequence[str]]) -> None:
    missing = set(graph.streams) - set(plan)
    extra = set(plan) - set(graph.streams)
    if missing or extra:
        raise OptimizerError(f"a plan needs one pipeline per stream; missing "
                             f"{sorted(missing)}, unknown {sorted(extra)}")


def plan_cost(graph: JoinGraph, plan: Mapping[str, Sequence[str]]) -> float:
    """Eq. 3: CPU_mjoin = Σ over the n pipelines of Eq. 2."""
    _check_plan(graph, plan)
    return sum(pipeline_cost(graph, s, plan[s]) for s in graph.streams)


def plan_objective(graph: JoinGraph, plan: Mapping[str, Sequence[str]],
                   objective: Objective = "cost") -> float:
    """Eq. 3 (objective "cost") or the plan's total intermediate tuples ("tuples")."""
    _check_plan(graph, plan)
    return sum(pipeline_objective(graph, s, plan[s], objective) for s in graph.streams)


def admissible(graph: JoinGraph, prefix: set[str] | frozenset[str],
               remaining: Iterable[str]) -> list[str]:
    """The streams of ``remaining`` that may join next without a needless cartesian
    product: those sharing a predicate with ``prefix``, or all of them when none does (the
    prefix's connected component is exhausted); sorted by name. ``engine.rules.admissible``
    on the graph's neighbours."""
    rest = sorted(remaining)
    return rules.admissible({s: graph.neighbors(s) for s in rest}, prefix, rest)


def is_cartesian_free(graph: JoinGraph, start: str, order: Sequence[str]) -> bool:
    """True when no stream of ``order`` joins by a cartesian product while some remaining
    stream shares a predicate with the prefix."""
    check_order(graph, start, order)
    prefix = {start}
    remaining = set(order)
    for s in order:
        if s not in admissible(graph, prefix, remaining):
            return False
        prefix.add(s)
        remaining.discard(s)
    return True
