"""A-Caching's policy: candidate caches and the offline cache selection algorithms
(a-caching.txt §4.4, §6, Appendix B). Pure functions: the engine mechanism that runs the
chosen caches and the profiler that estimates benefit and cost live elsewhere.

- ``candidates``: candidate enumeration (Def. 3.2 prefix invariant; §6 quota);
- ``model``: candidates, estimates, objectives (net benefit ≡ total cost);
- ``tree``: Theorem 4.1's O(m) algorithm (optimal without sharing);
- ``greedy``: Appendix B's greedy O(log n) approximation (Theorem 4.3);
- ``lp``: Appendix B's LP relaxation and randomized rounding (Theorem B.1);
- ``exhaustive``: the 2^m search (§4.4, §6).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from adaptcq.adapt.caching.candidates import (
    check_orders,
    enumerate_candidates,
    global_candidate,
    global_candidates,
    prefix_candidates,
    prefix_property,
    segment_key,
)
from adaptcq.adapt.caching.exhaustive import MAX_CANDIDATES, select_exhaustive
from adaptcq.adapt.caching.greedy import select_greedy
from adaptcq.adapt.caching.lp import Relaxation, select_lp, solve_relaxation
from adaptcq.adapt.caching.model import (
    Candidate,
    Estimate,
    Group,
    Operator,
    Selection,
    group_costs,
    is_nonoverlapping,
    net_benefit,
    proc,
    shared_groups,
    total_cost,
)
from adaptcq.adapt.caching.tree import containment_forest, refuse_shared, select_tree

METHODS = ("auto", "tree", "greedy", "lp", "exhaustive")

__all__ = [
    "MAX_CANDIDATES",
    "METHODS",
    "Candidate",
    "Estimate",
    "Group",
    "Operator",
    "Relaxation",
    "Selection",
    "check_method",
    "check_orders",
    "containment_forest",
    "enumerate_candidates",
    "global_candidate",
    "global_candidates",
    "group_costs",
    "is_nonoverlapping",
    "net_benefit",
    "prefix_candidates",
    "prefix_property",
    "proc",
    "segment_key",
    "select",
    "select_exhaustive",
    "select_greedy",
    "select_lp",
    "select_tree",
    "shared_groups",
    "solve_relaxation",
    "total_cost",
]


def check_method(method: str, candidates: Iterable[Candidate]) -> None:
    """Refuse a forced selection algorithm that cannot take ``candidates`` (a ValueError
    naming why): ``tree`` with a cache shared by several pipelines or a §6 cache, or
    ``exhaustive`` over more than MAX_CANDIDATES. ``auto`` takes any."""
    cands = list(candidates)
    if method == "tree":
        glob = next((c for c in cands if c.kind == "global"), None)
        if glob is not None:
            raise ValueError(f"the tree algorithm (Theorem 4.1) takes no globally-consistent "
                             f"(§6) cache such as {glob.name}; use greedy, lp, exhaustive "
                             "or auto, or --caches prefix")
        refuse_shared(cands)
    if method == "exhaustive" and len(cands) > MAX_CANDIDATES:
        raise ValueError(f"exhaustive cache selection over {len(cands)} candidates (2^"
                         f"{len(cands)} subsets) refused; the limit is {MAX_CANDIDATES} — use "
                         "the tree, greedy, lp or auto algorithm, or a smaller quota m (§6)")


def select(candidates: Iterable[Candidate], estimates: Mapping[Candidate, Estimate],
           operator_costs: Mapping[Operator, float], method: str = "auto",
           rng: np.random.Generator | int | None = None) -> Selection:
    """§4.4's offline cache selection.

    ``auto``: exhaustive search if any candidate is a globally-consistent §6 cache (the
    quota m bounds their number; the problem is then as hard as independent set); else the
    optimal tree algorithm (Theorem 4.1) when no candidate is shared (Def. 4.1); else the
    greedy approximation (Theorem 4.3). ``tree``, ``greedy``, ``lp`` (``rng`` seeds its
    rounding) and ``exhaustive`` force one algorithm."""
    cands = list(candidates)
    if method == "auto":
        if any(c.kind == "global" for c in cands) and len(cands) <= MAX_CANDIDATES:
            method = "exhaustive"
        elif any(c.kind == "global" for c in cands):
            method = "greedy"  # 2^m subsets would be too many: the approximation
        elif all(len(m) == 1 for m in shared_groups(cands).values()):
            method = "tree"
        else:
            method = "greedy"
    if method == "tree":
        return select_tree(cands, estimates, operator_costs)
    if method == "greedy":
        return select_greedy(cands, estimates, operator_costs)
    if method == "lp":
        return select_lp(cands, estimates, operator_costs, rng)
    if method == "exhaustive":
        return select_exhaustive(cands, estimates, operator_costs)
    raise ValueError(f"unknown cache selection method {method!r}; choose one of "
                     f"{', '.join(METHODS)}")
