"""Per-batch pipeline orders for the vectorized executor (issue 16, item 4).

The CAPE orderings (join-ordering.txt §3–§6) and A-Greedy's idea (a-caching.txt §4, [5]:
re-order a pipeline when the measured statistics say another order is cheaper) carried over
to batch granularity: after every batch, the join graph is rebuilt from what the batch
measured, and every pipeline not fixed by the user is ordered by the chosen algorithm for
the next batch. Any order gives the same results (the executor keeps no join subresult),
so a change costs nothing but the decision.

* :func:`measured_graph` (pure): the optimizer's JoinGraph with λ_s·W = the tuples now in
  s's window (W = 1) and σ per joined pair from the executor's measured matches per probe
  and window tuple (the W most recent batches); a pair not measured yet gets σ = 1/|W_y|
  (one match per probe: no preference).
* :class:`BatchOrdering`: the policy; the executor calls it after each batch.
* :func:`vector_executor`: the executor with this policy attached (both runtimes use it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from adaptcq.optimizer.graph import JoinGraph
from adaptcq.optimizer.planner import order_pipeline
from adaptcq.query.logical import LogicalQuery

ALGORITHM_DEFAULT = "fgreedy"


def measured_graph(query: LogicalQuery, sizes: Mapping[str, int],
                   selectivity: Mapping[tuple[str, str], float]) -> JoinGraph:
    """The join graph of ``query`` as measured: ``sizes`` (tuples per window, per stream)
    as rates with W = 1, and σ of each joined pair (a, b): the mean of the measured
    σ(a → b) and σ(b → a) that exist, else 1 / the larger window."""
    rates = {a: float(max(1, sizes.get(a, 0))) for a in query.aliases}
    sel = {}
    for a, b in query.join_edges():
        seen = [selectivity[k] for k in ((a, b), (b, a)) if k in selectivity]
        sigma = sum(seen) / len(seen) if seen else 1.0 / max(rates[a], rates[b])
        sel[(a, b)] = min(1.0, max(sigma, 1e-12))
    return JoinGraph(rates, sel, window=1.0)


class BatchOrdering:
    """Orders every pipeline (but the ``fixed`` ones) by ``algorithm`` (an
    ``optimizer.planner`` name) over :func:`measured_graph`, after every batch.

    The orders chosen after a batch are used by the next batch, if there is one; so
    ``ran`` holds the orders the last batch ran (per pipeline), and ``changes`` counts
    the pipelines whose order a batch ran differs from the one the previous batch ran — a
    re-ordering chosen after the last batch, that no batch used, is not counted."""

    def __init__(self, algorithm: str = ALGORITHM_DEFAULT, fixed: Iterable[str] = ()):
        from adaptcq.optimizer.planner import ordering
        ordering(algorithm)  # an unknown name is refused now, naming the known ones
        self.algorithm = algorithm
        self.fixed = frozenset(fixed)
        self.changes = 0
        self.ran: dict[str, tuple[str, ...]] | None = None  # the last batch's orders

    def __call__(self, executor) -> None:
        q = executor.query
        ran = {a: tuple(executor.orders[a]) for a in q.aliases}  # what this batch ran
        if self.ran is not None:
            self.changes += sum(ran[a] != self.ran[a] for a in q.aliases)
        self.ran = ran
        graph = measured_graph(
            q, {w.alias: len(w) - w.dead for w in executor.windows},
            {k: r.get() for k, r in executor.selectivity.items() if r.ready})
        for a in q.aliases:
            if a in self.fixed:
                continue
            order = order_pipeline(graph, a, self.algorithm)
            if order != executor.orders[a]:
                executor.set_order(a, order)  # (for the next batch, if any)

    def describe_ran(self, executor) -> str:
        """``executor.describe()`` with the orders the last batch ran (before any batch:
        the orders the first one will run); the executor's orders are left as they are."""
        if self.ran is None:
            return executor.describe()
        chosen = executor.orders
        executor.orders = {a: list(o) for a, o in self.ran.items()}
        try:
            return executor.describe()
        finally:
            executor.orders = chosen


def vector_executor(query: LogicalQuery, mode: str, schemas, *, time_unit: float,
                    signed: bool = False, orders: Mapping | None = None,
                    ordering: str | None = None):
    """The vectorized executor (engine.vector) with its per-batch ordering attached as an
    observer: ``ordering`` an optimizer algorithm (default fgreedy), or "off" (the orders
    stay as given); pipelines in ``orders`` are fixed either way."""
    from adaptcq.engine.vector import VectorJoin
    orders = dict(orders or {})
    vj = VectorJoin(query, mode, schemas, time_unit=time_unit, explicit_deletions=signed,
                    orders=orders)
    ordering = ordering or ALGORITHM_DEFAULT
    if ordering != "off":
        vj.observers.append(BatchOrdering(ordering, fixed=orders))
    return vj
