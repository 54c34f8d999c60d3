"""Setting up a load-shedding run (load-shedding.txt; docs/shedding.md): the ``shed``
option of a local run (``--shed --capacity --basic-window --index --buffer``) turned into
the load-shedding join's options and its controller."""

from __future__ import annotations

from collections.abc import Mapping

from adaptcq.errors import OptionError

KEYS = ("mode", "capacity", "basic_window", "index", "buffer", "gamma", "T_r", "T_c",
        "delta_r", "direction", "seed")


def shed_engine_options(spec: Mapping | None) -> tuple[object | None, dict]:
    """(the controller or None, the ``shed`` executor's options). ``spec`` keys:
    ``mode`` (none, random, partial, selective; default none), ``capacity`` (work units
    per second of event time, or "wall"), ``basic_window`` (seconds), ``index``,
    ``buffer`` (seconds), ``gamma`` (γ), ``T_r``, ``T_c``, ``delta_r`` (δ_r),
    ``direction`` (join direction adaptation, default on), ``seed``."""
    spec = dict(spec or {})
    unknown = sorted(set(spec) - set(KEYS))
    if unknown:
        raise OptionError(f"unknown shedding option {unknown[0]!r}; the options are: "
                          f"{', '.join(KEYS)}")
    mode = spec.get("mode", "none")
    controller = None
    if mode in ("partial", "selective"):
        from adaptcq.adapt.shed_control import ShedController
        kw = {k: spec[k] for k in ("T_r", "T_c", "delta_r", "direction") if k in spec}
        controller = ShedController(mode, **kw)
    elif "direction" in spec or any(k in spec for k in ("T_r", "T_c", "delta_r")):
        raise OptionError(f"join direction and the adaptation periods are for --shed "
                          f"selective or partial, not {mode}")
    options = {"shed": mode, "controller": controller}
    for k in ("capacity", "basic_window", "index", "buffer", "gamma", "seed"):
        if k in spec:
            options[k] = spec[k]
    return controller, options
