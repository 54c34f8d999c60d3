"""Continuous-query join ordering for MJoin pipelines (join-ordering.txt, CAPE).

Pure functions over an immutable :class:`JoinGraph` (λ per stream, σ per predicate pair,
window W): the per-unit-time cost model of §2.2 (Eq. 1–3) and the orderings DMJoin (§3.1),
F-Greedy (§3.2), TreeOpt (§4), FAB (§5) and Q-Aware (§6), one module each. This layer imports
only ``adaptcq.query`` and ``adaptcq.errors``; the engine asks it for a plan.

>>> from adaptcq.optimizer import JoinGraph, plan, plan_cost
>>> g = JoinGraph({"R": 10, "S": 20, "T": 5}, {("R", "S"): 0.1, ("S", "T"): 0.5})
>>> p = plan(g, "qaware")
>>> p["S"], round(plan_cost(g, p), 6)
(['R', 'T'], 1270.0)
"""

from adaptcq.optimizer.cost import (
    OBJECTIVES,
    Objective,
    admissible,
    intermediate_tuples,
    is_cartesian_free,
    join_factor,
    pipeline_cost,
    pipeline_objective,
    plan_cost,
    plan_objective,
    prefix_rates,
)
from adaptcq.optimizer.dmjoin import MAX_STREAMS as DMJOIN_MAX_STREAMS
from adaptcq.optimizer.dmjoin import dmjoin
from adaptcq.optimizer.exhaustive import connected_orders, exhaustive
from adaptcq.optimizer.fab import fab, gimpact_order, global_impact
from adaptcq.optimizer.fgreedy import fgreedy
from adaptcq.optimizer.graph import JoinGraph, OptimizerError
from adaptcq.optimizer.planner import ALGORITHMS, order_pipeline, ordering, plan
from adaptcq.optimizer.qaware import qaware, qaware_algorithm
from adaptcq.optimizer.random_graphs import SHAPES, random_edges, random_graph
from adaptcq.optimizer.treeopt import spanning_tree, treeopt

__all__ = [
    "ALGORITHMS",
    "DMJOIN_MAX_STREAMS",
    "OBJECTIVES",
    "SHAPES",
    "JoinGraph",
    "Objective",
    "OptimizerError",
    "admissible",
    "connected_orders",
    "dmjoin",
    "exhaustive",
    "fab",
    "fgreedy",
    "gimpact_order",
    "global_impact",
    "intermediate_tuples",
    "is_cartesian_free",
    "join_factor",
    "order_pipeline",
    "ordering",
    "pipeline_cost",
    "pipeline_objective",
    "plan",
    "plan_cost",
    "plan_objective",
    "prefix_rates",
    "qaware",
    "qaware_algorithm",
    "random_edges",
    "random_graph",
    "spanning_tree",
    "treeopt",
]
