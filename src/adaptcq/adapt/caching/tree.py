"""Theorem 4.1's bottom-up algorithm: the optimal nonoverlapping caches without sharing
(a-caching.txt §4.4, Proof 4.1, Theorem 4.2's second half).

By the prefix invariant, two overlapping candidates of one pipeline are nested, so each
pipeline's candidates form a forest under containment (parent: the smallest strict
superset). For the subtree T rooted at C the optimum is either {C} or the union of the
optima of C's children; the forest's optimum is the union over its trees, and with no
shared caches the pipelines are independent. The weight of C is benefit(C) − cost(C).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from adaptcq.adapt.caching.model import (
    Candidate,
    Estimate,
    Operator,
    Selection,
    check_instance,
    group_name,
    shared_groups,
)


def containment_forest(candidates: Iterable[Candidate]) -> dict[Candidate | None, list[Candidate]]:
    """Children lists of the containment forest of each pipeline (§4.4); the roots are the
    children of ``None``. Raises ValueError if two candidates of one pipeline overlap
    without one containing the other (then they are not a forest; e.g. §6 caches)."""
    children: dict[Candidate | None, list[Candidate]] = defaultdict(list)
    by_pipe: dict[str, list[Candidate]] = defaultdict(list)
    for c in candidates:
        by_pipe[c.pipeline].append(c)
    for cands in by_pipe.values():
        cands.sort(key=lambda c: (c.start, -c.end))
        stack: list[Candidate] = []
        for c in cands:
            while stack and stack[-1].end < c.start:
                stack.pop()
            if stack and c.end > stack[-1].end:
                raise ValueError(f"candidates {stack[-1].name} and {c.name} overlap without "
                                 f"nesting; the tree algorithm (Theorem 4.1) needs a "
                                 f"containment forest")
            children[stack[-1] if stack else None].append(c)
            stack.append(c)
    return children


def refuse_shared(cands: list[Candidate]) -> None:
    """The tree algorithm's instances share no cache (Def. 4.1): a ValueError otherwise."""
    for g, members in shared_groups(cands).items():
        if len(members) > 1:
            raise ValueError(
                f"the tree algorithm (Theorem 4.1) is optimal only without shared caches, "
                f"but {group_name(g)} is shared by "
                f"{', '.join(c.pipeline for c in members)}; use greedy, lp or exhaustive")


def select_tree(candidates: Iterable[Candidate], estimates: Mapping[Candidate, Estimate],
                operator_costs: Mapping[Operator, float]) -> Selection:
    """Theorem 4.1 / Proof 4.1: bottom-up over each pipeline's containment forest,
    opt(T_C) = {C} if benefit(C) − cost(C) > Σ opt(children) else ∪ opt(children).
    Linear in the number of candidates once the forest is built (building it sorts).

    Raises ValueError for shared candidates (Def. 4.1): then the problem is NP-hard
    (Theorem 4.2) — use the greedy, LP or exhaustive algorithm."""
    cands = check_instance(candidates, estimates, operator_costs)
    refuse_shared(cands)
    children = containment_forest(cands)
    best: dict[Candidate, tuple[float, list[Candidate]]] = {}

    def solve(c: Candidate) -> tuple[float, list[Candidate]]:
        # Iterative post-order keeps deep chains off the Python stack.
        stack = [(c, False)]
        while stack:
            node, done = stack.pop()
            if not done:
                stack.append((node, True))
                stack.extend((k, False) for k in children.get(node, ()))
                continue
            value, chosen = 0.0, []
            for k in children.get(node, ()):
                v, s = best[k]
                value += v
                chosen += s
            est = estimates[node]
            own = est.benefit - est.cost
            best[node] = (own, [node]) if own > value else (value, chosen)
        return best[c]

    chosen: list[Candidate] = []
    for root in children.get(None, ()):
        chosen += solve(root)[1]
    return Selection.of(chosen, estimates, operator_costs, "tree")
