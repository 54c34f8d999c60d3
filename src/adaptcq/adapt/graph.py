"""The optimizer's join graph from a running query's measured statistics.

``stats.profiler`` measures (rates, state sizes, σ); turning those measurements into the
input of ``optimizer.plan`` — choosing a window W, flooring σ, defaulting what was never
measured — is a decision of the policies that call the optimizer (``adapt.reorder``'s
InitialPlan, ``adaptcq explain``), so it lives here.
"""

from __future__ import annotations

#: Rates below this are treated as this (the cost model needs λ > 0).
MIN_RATE = 1e-9


def common_range(query) -> float | None:
    """The window length w when every stream has the same ``[RANGE w]`` window, else None."""
    sizes = {(s.window.kind, s.window.size) for s in query.streams}
    if len(sizes) == 1:
        kind, size = next(iter(sizes))
        if kind == "range" and size and size > 0:
            return float(size)
    return None


def join_graph_from_stats(query, profile, *, c_insert: float = 1.0,
                          c_delete: float = 1.0, c_join: float = 1.0):
    """The optimizer's join graph (join-ordering.txt §2.1–2.2) from the measured
    statistics of ``profile`` (a ``stats.profiler.Profiler``).

    * λ_i — measured rate(R_i) (insertions per second of event time);
    * σ_ij — ``Profiler.selectivity`` for every pair the query joins (its join graph's
      edges); 0 measured becomes ``Profiler.sigma_floor``, none measured becomes 1
      (nothing known: the pessimistic value);
    * W — when every stream has the same ``[RANGE w]`` window, w (so λ_i·W is the expected
      state size). Otherwise (``[ROWS n]``, unbounded, or different ranges) one W cannot
      make λ_i·W the state size of every stream. Each pipeline's *order* depends only on
      the state sizes λ_j·W of the other streams and the σ's (λ_start scales the whole
      pipeline, Eq. 2), so we keep the measured state sizes exact: W = Σ|R_j| / Σ rate(R_j)
      and λ_j = |R_j| / W. Orders are then those for the true state sizes; the plan's total
      cost weighs pipelines by λ_j ∝ |R_j| rather than by the true rates.

    Unit costs default to 1 (Table 1's C_insert, C_delete, C_join).
    """
    from adaptcq.optimizer import JoinGraph

    aliases = query.aliases
    rates = {a: max(MIN_RATE, profile.rate(a)) for a in aliases}
    window = common_range(query)
    if window is None:
        sizes = {a: profile.state_size(a) for a in aliases}
        total_rate = sum(profile.rate(a) for a in aliases)
        if sum(sizes.values()) > 0 and total_rate > 0:
            window = sum(sizes.values()) / total_rate
            rates = {a: max(MIN_RATE, sizes[a] / window) for a in aliases}
        else:
            window = 1.0
    sel = {}
    for a, b in query.join_edges():
        sigma = profile.selectivity(a, b)
        if sigma is None:
            sigma = 1.0
        elif sigma <= 0:
            sigma = profile.sigma_floor(a, b)
        sel[frozenset((a, b))] = min(1.0, sigma)
    return JoinGraph(rates, sel, window=window, c_insert=c_insert, c_delete=c_delete,
                     c_join=c_join)
