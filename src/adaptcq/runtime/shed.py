"""Setting up a load-shedding run (load-shedding.txt; docs/shedding.md): the ``shed``
option of a local run (``--shed --capacity --basic-window --index --buffer``) turned into
the load-shedding join's options and its controller."""

from __future__ import annotations

from collections.abc import Mapping

from adaptcq.checks import is_int
from adaptcq.errors import OptionError

KEYS = ("mode", "capacity", "basic_window", "index", "buffer", "gamma", "T_r", "T_c",
        "delta_r", "direction", "seed", "utility", "budget")


def shed_engine_options(spec: Mapping | None, *, spark: bool = False
                        ) -> tuple[object | None, dict]:
    """(the controller or None, the ``shed`` executor's options). ``spec`` keys:
    ``mode`` (none, random, partial, selective; default none), ``capacity`` (work units
    per second of event time, or "wall"), ``basic_window`` (seconds), ``index``,
    ``buffer`` (seconds), ``gamma`` (γ), ``T_r``, ``T_c`` (selective only: partial
    processing has no time correlation, §4.1), ``delta_r`` (δ_r), ``direction`` (join
    direction adaptation, default on; a two-way algorithm, so the n-way join refuses it:
    ``ShedController.bind``), ``seed``; ``budget`` (seconds of CPU per micro-batch, only
    with ``spark=True``: the Spark runtime sets it from the trigger interval for
    ``capacity="wall"``; r then moves once per micro-batch instead of every T_r, and
    ``random`` drops arrivals at random at the rate)."""
    if spec is not None and not isinstance(spec, Mapping):  # (dict() raised a raw error)
        raise OptionError(f"shed must be a dict of shedding options, e.g. shed={{'mode': "
                          f"'selective', 'capacity': 156250}}; got {spec!r}")
    spec = dict(spec or {})
    unknown = sorted(set(spec) - set(KEYS))
    if unknown:
        raise OptionError(f"unknown shedding option {unknown[0]!r}; the options are: "
                          f"{', '.join(KEYS)}")
    if "budget" in spec and not spark:
        # (A local run has no micro-batches whose CPU time a budget could be held
        # against: it would be accepted and never applied.)
        raise OptionError(f"shedding option 'budget' ({spec['budget']!r}) is a CPU budget "
                          "per Spark micro-batch, set by the Spark runtime from the trigger "
                          "interval (--capacity wall --trigger SECONDS); a local run has no "
                          "micro-batches: give --capacity UNITS or --capacity wall instead")
    _check_values(spec)
    mode = spec.get("mode", "none")
    if "direction" in spec and mode != "selective":
        raise OptionError(f"--no-join-direction is for --shed selective (join direction is "
                          f"Algorithm 4 of selective processing), not {mode}")
    if "direction" in spec and "utility" in spec:
        raise OptionError("--no-join-direction with --utility: utility-based shedding "
                          "(Algorithm 5) replaces join direction; give one of them")
    if "buffer" in spec and "capacity" not in spec:
        raise OptionError("--buffer needs --capacity: without a CPU limit every tuple is "
                          "processed on arrival and nothing waits in a buffer")
    if "T_c" in spec and mode != "selective":
        raise OptionError(f"T_c (the time correlation period, Algorithm 2) is for --shed "
                          f"selective, not {mode}: --shed {mode} has no time correlation"
                          + (" (rate adaptation only, windows processed newest first)"
                             if mode == "partial" else ""))
    if "T_r" in spec and "budget" in spec:
        raise OptionError("T_r (the rate adaptation period) with a CPU budget per "
                          "micro-batch (--capacity wall on Spark): r then moves once per "
                          "micro-batch, from its CPU time, not every T_r")
    if "gamma" in spec and mode not in ("partial", "selective"):
        raise OptionError(f"gamma (the sampling probability of full processing) is for "
                          f"--shed selective or partial, not {mode}")
    budget = spec.pop("budget", None)
    if budget is not None and spec.get("capacity") != "wall":
        raise OptionError("a CPU budget per micro-batch is for --capacity wall")
    if budget is not None and "buffer" in spec:
        raise OptionError("--buffer with a budget per micro-batch: a Spark partition group "
                          "processes each micro-batch whole, with r set from the last one's "
                          "CPU time (docs/shedding.md, \"On Spark\"); it has no input buffer")
    controller = None
    if mode in ("partial", "selective") or (budget is not None and mode == "random"):
        from adaptcq.adapt.shed_control import ShedController
        kw = {k: spec[k] for k in ("T_r", "T_c", "delta_r", "direction") if k in spec}
        controller = ShedController(mode, budget=budget, **kw)
    elif any(k in spec for k in ("T_r", "T_c", "delta_r")):
        raise OptionError(f"the adaptation periods (T_r, T_c, delta_r) are for --shed "
                          f"selective or partial, not {mode}")
    options = {"shed": mode, "controller": controller}
    if "utility" in spec and mode != "selective":
        raise OptionError(f"--utility is for --shed selective (utility-based shedding, "
                          f"Algorithm 5), not {mode}")
    for k in ("capacity", "basic_window", "index", "buffer", "gamma", "seed"):
        if k in spec:
            options[k] = spec[k]
    if budget is not None:
        options["capacity"] = "batch"
    return controller, options


def _check_values(spec: Mapping) -> None:
    """Each option's type and range, up front (for Spark on the driver, before any
    partition group builds its join), naming the option and its value. The adaptation
    periods are checked by the controller, built in ``shed_engine_options``."""
    from adaptcq.engine.shed_join import (
        _seconds,
        check_capacity,
        check_gamma,
        check_mode_and_index,
    )
    mode, index = spec.get("mode", "none"), spec.get("index", "auto")
    check_mode_and_index(mode, index)
    check_capacity(spec.get("capacity"))
    for key, flag in (("basic_window", "--basic-window"), ("buffer", "--buffer")):
        if key in spec:
            _seconds(flag, spec[key])
    if "gamma" in spec:
        check_gamma(spec["gamma"])
    if "utility" in spec and not isinstance(spec["utility"], str):
        raise OptionError(f"--utility must be a CASE expression as text, got "
                          f"{spec['utility']!r}")
    if "seed" in spec:
        seed = spec["seed"]
        if not is_int(seed):
            raise OptionError(f"seed must be an integer, got {seed!r}")
        if mode == "none":  # (as the CLI refuses --seed)
            # inverted-id's random identifiers (§4.2.1: in the paper, the tuples'
            # addresses) order its lists, but its cost is charged per list length and
            # candidates are tested in time order, so no identifier changes anything.
            raise OptionError(f"seed {seed}: nothing random in this run uses it (--shed none "
                              "drops and samples no tuple at random; the identifiers of "
                              "--index inverted-id change neither the output nor the work "
                              "counted); it seeds --shed random, partial and selective")


def utility_types(query, text: str, kinds: Mapping[str, Mapping[str, str]]):
    """``--utility "CASE kind WHEN 'alert' THEN 3 ... ELSE 1 END"`` (load-shedding.txt
    §5.3): each WHEN branch is a tuple type z with the utility V(z) of its THEN constant,
    ELSE one more type (utility 0 without ELSE). Columns are unqualified: each stream's
    own. Returns (the query with those columns added to its streams' rows, per stream a
    function row -> type index, the utilities V, the type names)."""
    import dataclasses

    import sqlglot
    import sqlglot.expressions as exp
    from sqlglot.errors import ParseError

    from adaptcq.query.expr import ExprError, compile_predicate, constant_value

    try:
        case = sqlglot.parse_one(text)
    except ParseError as e:
        raise OptionError(f"--utility: cannot read {text!r}: {e}") from None
    if not isinstance(case, exp.Case):
        raise OptionError(f"--utility must be a CASE expression (CASE kind WHEN 'a' THEN 3 "
                          f"... ELSE 1 END), got {text!r}")
    conds, values, names = [], [], []
    for branch in case.args.get("ifs") or []:
        cond = branch.this
        if case.this is not None:  # simple CASE: CASE x WHEN v THEN ...
            cond = exp.EQ(this=case.this.copy(), expression=cond.copy())
        conds.append(cond)
        values.append(_utility_value(branch.args["true"], constant_value, exp))
        names.append(cond.sql())
    if not conds:
        raise OptionError("--utility: a CASE with at least one WHEN ... THEN")
    default = case.args.get("default")
    values.append(0.0 if default is None else _utility_value(default, constant_value, exp))
    names.append("ELSE")
    used = list(dict.fromkeys(c.name for c in case.find_all(exp.Column)))
    for c in case.find_all(exp.Column):
        if c.table:
            raise OptionError(f"--utility: write columns unqualified ({c.name}, not "
                              f"{c.sql()}): each stream's type comes from its own columns")
    columns, types = dict(query.columns), {a: dict(t) for a, t in query.types.items()}
    for s in query.streams:
        have = kinds.get(s.source, {})
        for col in used:
            if col not in have:
                raise OptionError(f"--utility: stream {s.alias} has no column {col!r} (its "
                                  f"columns: {', '.join(have)})")
            if col not in columns[s.alias]:
                columns[s.alias] = (*columns[s.alias], col)
            types.setdefault(s.alias, {})[col] = have[col]
    query = dataclasses.replace(query, columns=columns, types=types)
    fns = []
    for s in query.streams:
        try:
            preds = [compile_predicate(c, columns[s.alias], s.alias, types) for c in conds]
        except ExprError as e:
            raise OptionError(f"--utility: {e}") from None
        fns.append(_type_function(preds))
    return query, fns, values, names


def _utility_value(node, constant_value, exp) -> float:
    try:
        v = constant_value(node)
    except Exception:  # noqa: BLE001 - any non-constant: named below
        v = None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise OptionError(f"--utility: a utility must be a constant number >= 0, got "
                          f"{node.sql()}")
    return float(v)


def _type_function(preds):
    last = len(preds)

    def type_of(row: tuple) -> int:
        for z, pred in enumerate(preds):
            if pred(row):
                return z
        return last
    return type_of


def spark_shed_spec(spec: Mapping | None, groups: int, cores: int) -> dict | None:
    """The ``shed`` option of a Spark run (docs/shedding.md, "On Spark"), checked on the
    driver, as every partition group will build it (``engine_options``). ``interval`` is
    the streaming query's trigger interval in seconds: with ``capacity="wall"`` each group
    has a CPU budget per micro-batch of ``interval · min(1, cores/groups)`` (its share of
    the cores) and adapts r once per micro-batch from the batch's CPU time against it. A
    numeric capacity is each group's, on the virtual clock, as in the local runtime."""
    if spec is None:
        return None
    spec = dict(spec)
    if "budget" in spec:
        raise OptionError("shedding option 'budget' is set by the Spark runtime from "
                          "'interval' (the trigger interval); give interval")
    if "utility" in spec:
        raise OptionError("--utility is not supported on Spark yet: the tuple types' "
                          "columns would have to travel with every row through the split; "
                          "use --engine local")
    interval = spec.pop("interval", None)
    if spec.get("capacity") == "wall":
        if interval is None:
            raise OptionError("--capacity wall on Spark needs the trigger interval "
                              "(--trigger SECONDS; shed={'interval': ...}): a partition group "
                              "adapts r once per micro-batch from its CPU time against its "
                              "share of that interval")
        try:
            interval = float(interval)
        except (TypeError, ValueError):
            interval = float("nan")
        if not 0 < interval < float("inf"):
            raise OptionError(f"the trigger interval must be a positive number of seconds, "
                              f"got {interval!r}")
        if spec.get("mode", "none") == "none":
            del spec["capacity"]  # nothing to adapt: every tuple is processed
        else:
            spec["budget"] = interval * min(1.0, cores / groups)
    elif interval is not None:
        raise OptionError("the trigger interval is the CPU budget of --capacity wall; with "
                          f"capacity {spec.get('capacity')!r} it is not used")
    shed_engine_options(spec, spark=True)  # every refusal here, on the driver
    return spec


def engine_options(options: Mapping) -> dict:
    """``options`` with a ``shed`` spec turned into the load-shedding join's own options
    and a fresh controller (one per engine: a partition group's is its own)."""
    options = dict(options)
    spec = options.pop("shed", None)
    if spec is not None:
        options.update(shed_engine_options(spec, spark=True)[1])
    return options
