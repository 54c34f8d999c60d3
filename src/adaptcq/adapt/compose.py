"""Adaptive policies composed as a list (``adapt.make_policies``): the initial plan from the
optimizer, A-Greedy and A-Caching, attached to one query in that order and sharing its
one Profiler.

How the policies of one query combine (``ContinuousQuery.attach``):

* **p** — each pipeline i is profiled with p_i = the maximum of the policies'
  ``stream_probability(i)`` (the query samples with the maximum p and thins per
  pipeline), so every policy gets at least the observations it asked for;
* **interval** — the query ticks at the smallest interval of its policies, and every
  policy is ticked then;
* **W** — one per query: the profiler keeps W observations per statistic, set by the
  first policy attached; a policy with another W is refused. ``make_policies`` gives
  every policy the same ``W``.

Order matters where policies interact: the initial plan sets the orders, A-Greedy waits
for it (``wait_for``), and A-Caching comes last so that at a tick it sees the orders the
others have just set (a re-ordering restarts the candidates of that pipeline, §4.5 step 5).
"""

from __future__ import annotations

from collections.abc import Mapping

from adaptcq.checks import is_finite, is_int
from adaptcq.errors import AdaptcqError, OptionError

#: Parameters shared by every policy built (one W per query; one seed; one tick interval).
COMMON = ("W", "interval", "seed")
#: Parameters of the ordering policies: ``p`` (A-Greedy's and the initial plan's profiling
#: probability; ``initial_p`` overrides the initial plan's), ``alpha`` (A-Greedy),
#: ``objective`` (the initial plan).
ORDERING = ("p", "alpha", "objective", "initial_p", "cheap")
#: Keys of ``caching`` (``adapt.acaching.ACaching``'s options; W, interval and seed come
#: from the common parameters unless given here).
CACHING = ("caches", "memory", "reopt_interval", "change", "m", "W_d", "alpha", "method",
           "p", "W", "interval", "seed", "verify", "trial")

_INITIAL = "the initial plan (optimizer=...)"
_AGREEDY = "A-Greedy (reorder='agreedy')"
#: Which policies take each parameter, for the refusal of one that no policy built uses.
_TAKEN_BY = {**dict.fromkeys(COMMON, f"{_INITIAL}, {_AGREEDY} and A-Caching (caching=...)"),
             "p": f"{_INITIAL} and {_AGREEDY}", "alpha": _AGREEDY, "cheap": _AGREEDY,
             "objective": _INITIAL, "initial_p": _INITIAL}


class PolicyTypeError(OptionError, TypeError):
    """A policy parameter of the wrong type (A-Greedy's ``cheap="no"``): an option error,
    and still the TypeError the policy raises for it."""


def make_policies(optimizer: str | None = None, reorder: str = "off",
                  caching: Mapping | None = None, **params) -> list:
    """The policies for ``adaptcq run --optimizer ALGORITHM --reorder agreedy|off`` and
    A-Caching (``--executor acaching``), in the order they must be attached.

    * ``optimizer`` — an ``optimizer.ALGORITHMS`` name: ``InitialPlan(optimizer)``;
    * ``reorder`` — ``"agreedy"``: ``AGreedy`` (after the initial plan, waiting for it);
    * ``caching`` — None, or a dict of ``ACaching`` options (``caches``, ``memory``,
      ``reopt_interval``, ``change``, ``m``, ``W_d``, ``alpha``, ``method``, ``p``, and
      ``W``/``interval``/``seed`` overriding the common ones): ``ACaching``, last;
    * ``params`` — ``W``, ``interval``, ``seed`` for every policy; ``p``, ``alpha``,
      ``objective``, ``initial_p`` for the ordering policies; ``cheap`` (A-Greedy's cheap
      profiling, default True).

    Unknown parameters, reorder values and caching options are refused, naming them, and
    so is a parameter that no policy built takes (``alpha`` without A-Greedy: it was
    dropped unchecked); bad values are refused by the policies (ACaching names the
    command-line option) as an ``OptionError``. Returns
    a list (empty when nothing is asked for); every policy's ``report()`` is a
    JSON-serialisable dict."""
    from adaptcq.adapt.reorder import REORDER_CHOICES

    if reorder not in REORDER_CHOICES:
        raise AdaptcqError(f"unknown --reorder {reorder!r}; choose one of "
                           f"{', '.join(REORDER_CHOICES)}")
    known = set(COMMON) | set(ORDERING)
    unknown = sorted(set(params) - known)
    if unknown:
        raise AdaptcqError(f"unknown policy parameter(s) {', '.join(unknown)}; "
                           f"known: {', '.join(sorted(known))}")
    if caching is not None and not isinstance(caching, Mapping):
        raise AdaptcqError(f"caching must be None or a dict of A-Caching options, got "
                           f"{type(caching).__name__}")
    bad = sorted(set(caching or ()) - set(CACHING))
    if bad:
        raise AdaptcqError(f"unknown A-Caching option(s) {', '.join(map(str, bad))}; "
                           f"known: {', '.join(sorted(CACHING))}")
    _refuse_unused(optimizer, reorder, caching, params)
    # (the policies took seed="x" or 1.5 unchecked, and alpha="x" failed on a comparison)
    if "seed" in params and not is_int(params["seed"]):
        raise OptionError(f"policy parameter seed must be a whole number, got "
                          f"{params['seed']!r}")
    if "alpha" in params and not is_finite(params["alpha"]):
        raise OptionError(f"policy parameter alpha (A-Greedy's tolerance) must be a number, "
                          f"got {params['alpha']!r}")
    try:
        return _make(optimizer, reorder, caching, params)
    except AdaptcqError:
        raise
    except ValueError as e:  # a policy's own check: an option error, named as such
        raise OptionError(str(e)) from None
    except TypeError as e:  # (its type checks: A-Greedy's cheap)
        raise PolicyTypeError(str(e)) from None


def params_used(optimizer, reorder, caching, params) -> set[str]:
    """The parameters of ``params`` that the policies asked for take (a Spark group
    rebuilt without its optimizer keeps only these)."""
    used: set[str] = set()
    if optimizer is not None:
        used |= {*COMMON, "objective", "initial_p"}
        if "initial_p" not in params:
            used.add("p")
    if reorder == "agreedy":
        used |= {*COMMON, "p", "alpha", "cheap"}
    if caching is not None:
        used |= set(COMMON) - set(caching)  # (caching's own W, interval, seed win)
    return used & set(params)


def _refuse_unused(optimizer, reorder, caching, params) -> None:
    """Refuse a parameter that none of the policies asked for takes, naming the policies
    that do: it would be dropped, its value never checked (``alpha=-1`` with only an
    initial plan)."""
    used = params_used(optimizer, reorder, caching, params)
    unused = [k for k in params if k not in used]
    if not unused:
        return
    name = unused[0]
    asked = [what for what, on in (("optimizer", optimizer is not None),
                                   ("reorder='agreedy'", reorder == "agreedy"),
                                   ("caching", caching is not None)) if on]
    if name in COMMON and caching is not None and name in caching:
        why = f"A-Caching takes the {name} that caching gives, and no other policy is built"
    elif name == "p" and optimizer is not None:
        why = "initial_p overrides it for the initial plan, and no A-Greedy is built"
    else:
        why = (f"it is for {_TAKEN_BY[name]}, and this asks for "
               f"{' and '.join(asked) + ' only' if asked else 'no policy'}")
    if name in ("p", "alpha") and caching is not None:  # (A-Caching has its own)
        why += f" (A-Caching's own {name} goes in caching)"
    raise OptionError(f"policy parameter {name}={params[name]!r} is used by no policy built: "
                      f"{why}; drop it or ask for a policy that takes it")


def _make(optimizer, reorder, caching, params) -> list:
    """The policies of ``make_policies``, built (their names checked already)."""
    from adaptcq.adapt.reorder import AGreedy, InitialPlan
    common = {k: params[k] for k in COMMON if k in params}
    policies: list = []
    initial = None
    if optimizer is not None:
        p0 = params.get("initial_p", params.get("p"))
        initial = InitialPlan(optimizer, objective=params.get("objective", "cost"),
                              **({"p": p0} if p0 is not None else {}), **common)
        policies.append(initial)
    if reorder == "agreedy":
        extra = {k: params[k] for k in ("p", "alpha", "cheap") if k in params}
        policies.append(AGreedy(wait_for=initial, **extra, **common))
    if caching is not None:
        from adaptcq.adapt.acaching import ACaching
        policies.append(ACaching(**{**common, **caching}))
    windows = sorted({pol.W for pol in policies})
    if len(windows) > 1:
        raise AdaptcqError(f"the policies of one query share one profiler, so one W; got "
                           f"W = {', '.join(map(str, windows))} (give W once, as a common "
                           "parameter)")
    return policies
