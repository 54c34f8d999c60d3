"""Appendix B's LP relaxation with randomized rounding (a-caching.txt Theorem B.1, Proof B.1).

Integer program: a variable x_c per candidate c and per operator p (the operator as a
zero-length cache, B = d·c, no group cost; §4.4), a variable z_r per group G_r (Def. 4.1);

    minimize    Σ_c B_c x_c + Σ_r L_r z_r
    subject to  Σ_{c ∋ p} x_c = 1     for every operator p (covered exactly once)
                z_r ≥ x_c             for every c ∈ G_r   (z_r = max_{c∈G_r} x_c at the optimum)
                x_c, z_r ∈ {0, 1}

relaxed to 0 ≤ x_c, z_r ≤ 1 and solved with HiGHS; its optimum is a lower bound on the
optimal total cost. Rounding (Proof B.1): per group an α_r uniform in (0, 1], choose every
c ∈ G_r with x_c ≥ α_r (so c is chosen with probability x_c and G_r with probability z_r);
repeat ⌈3 ln m⌉ times (m = number of operators), take the union, and where chosen caches
overlap keep the one covering the most operators. An operator no chosen cache covers runs as
itself (its zero-length cache), so the operators' own variables need no rounding.

Appendix B states, proof omitted, that the LP optimum is integral when every operator is in
at most two non-zero-length caches. That holds without sharing (each pipeline's coverage
matrix is then an interval/laminar one) and when every operator is in at most one cache,
but not in general: three shared groups whose caches pair up in three pipelines (an odd
cycle) have the fractional optimum x = z = 1/2 (see ``tests/test_cache_selection.py``).
When the optimum found is integral it is returned as is (it is then optimal).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from adaptcq.adapt.caching.model import (
    Candidate,
    Estimate,
    Group,
    Operator,
    Selection,
    check_instance,
    group_costs,
    proc,
    resolve_overlaps,
    shared_groups,
    sort_key,
)

INTEGRAL_TOL = 1e-7


@dataclass(frozen=True)
class Relaxation:
    """The LP optimum: ``value`` (a lower bound on the optimal total cost), x_c per candidate,
    x_p per operator (its zero-length cache), z_r per group; ``integral`` when every x is
    within 1e-7 of 0 or 1."""

    value: float
    x: dict[Candidate, float]
    operator_x: dict[Operator, float]
    z: dict[Group, float]

    @property
    def integral(self) -> bool:
        xs = [*self.x.values(), *self.operator_x.values()]
        return all(min(v, 1.0 - v) <= INTEGRAL_TOL for v in xs)


def solve_relaxation(candidates: Iterable[Candidate], estimates: Mapping[Candidate, Estimate],
                     operator_costs: Mapping[Operator, float]) -> Relaxation:
    """Solve Appendix B's LP relaxation with ``scipy.optimize.linprog(method="highs")``."""
    # (imported here: scipy takes 0.2 s to import, and most queries never need the LP)
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix
    cands = sorted(check_instance(candidates, estimates, operator_costs), key=sort_key)
    ops = sorted(operator_costs, key=lambda o: (o[0], o[1]))
    groups = list(shared_groups(cands))
    lead = group_costs(cands, estimates)
    nc, no, ng = len(cands), len(ops), len(groups)
    op_index = {op: i for i, op in enumerate(ops)}
    g_index = {g: i for i, g in enumerate(groups)}
    # Columns: x_c (nc), x_p (no), z_r (ng).
    cost = np.array([proc(c, estimates[c], operator_costs) for c in cands]
                    + [operator_costs[o] for o in ops] + [lead[g] for g in groups], dtype=float)
    rows, cols = [], []
    for j, c in enumerate(cands):
        for op in c.operators:
            rows.append(op_index[op])
            cols.append(j)
    for i in range(no):
        rows.append(i)
        cols.append(nc + i)
    a_eq = coo_matrix((np.ones(len(rows)), (rows, cols)), shape=(no, nc + no + ng)).tocsr()
    b_eq = np.ones(no)
    ub_rows, ub_cols, ub_vals = [], [], []
    for j, c in enumerate(cands):  # x_c − z_r ≤ 0
        ub_rows += [j, j]
        ub_cols += [j, nc + no + g_index[c.group]]
        ub_vals += [1.0, -1.0]
    a_ub = (coo_matrix((ub_vals, (ub_rows, ub_cols)), shape=(nc, nc + no + ng)).tocsr()
            if nc else None)
    b_ub = np.zeros(nc) if nc else None
    if no == 0:
        return Relaxation(0.0, {c: 0.0 for c in cands}, {}, {g: 0.0 for g in groups})
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=(0.0, 1.0),
                  method="highs")
    if res.status != 0:
        raise RuntimeError(f"HiGHS could not solve the cache-selection LP: {res.message}")
    sol = np.clip(res.x, 0.0, 1.0)
    return Relaxation(float(res.fun),
                      {c: float(sol[j]) for j, c in enumerate(cands)},
                      {o: float(sol[nc + i]) for i, o in enumerate(ops)},
                      {g: float(sol[nc + no + i]) for i, g in enumerate(groups)})


def default_rounds(operators: int) -> int:
    """⌈3 ln m⌉ rounds for m operators (Proof B.1), at least one."""
    return max(1, math.ceil(3 * math.log(operators))) if operators > 1 else 1


def select_lp(candidates: Iterable[Candidate], estimates: Mapping[Candidate, Estimate],
              operator_costs: Mapping[Operator, float],
              rng: np.random.Generator | int | None = None,
              rounds: int | None = None) -> Selection:
    """Theorem B.1's randomized O(log n) approximation (see the module notes). The result
    carries ``lower_bound`` (the LP optimum) and ``integral`` (the LP optimum was integral,
    so the selection is optimal). ``rng`` is a numpy Generator or a seed."""
    cands = sorted(check_instance(candidates, estimates, operator_costs), key=sort_key)
    relax = solve_relaxation(cands, estimates, operator_costs)
    if relax.integral:
        chosen = [c for c in cands if relax.x[c] >= 0.5]
        return Selection.of(chosen, estimates, operator_costs, "lp", relax.value, True)
    if rounds is None:
        rounds = default_rounds(len(operator_costs))
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    gen = np.random.default_rng(rng)
    groups = shared_groups(cands)
    picked: list[Candidate] = []
    for _ in range(rounds):
        for members in groups.values():
            alpha = 1.0 - gen.random()  # uniform in (0, 1]
            picked += [c for c in members if relax.x[c] >= alpha]
    return Selection.of(resolve_overlaps(picked), estimates, operator_costs, "lp",
                        relax.value, False)
