"""User-defined functions callable from a query's SQL (cacq.txt §5, Figure 11(b)).

CACQ's UDF experiment has every user select stock quotes with a UDF of their own; the
eddy applies such a selection to the quotes before the join, where NiagaraCQ must apply
it after. A UDF cannot go into a grouped filter (§3.2.6): the query's CNF (§3.2.7,
``query.cnf``) keeps it as an *opaque* atom, evaluated by a compiled predicate.

A UDF is a Python callable under a name. ``register_udf`` puts it into a registry: the
process-wide default one (what ``parse_query`` and ``compile_predicate`` use when given no
``udfs=``), or a dict of your own that you pass as ``udfs=``::

    register_udf("interesting", lambda price, symbol: price > 100 and symbol != "X")
    q = parse_query("SELECT * FROM S WHERE interesting(S.price, S.symbol)", schemas)

Semantics, as a SQL engine with Python UDFs (Spark's) has them:

- Arguments are the row's Python values, ``None`` for NULL (the function is called on
  NULLs too: it decides what they mean).
- The result ``None`` is NULL. As a condition (``WHERE f(x)``) a result is TRUE when it is
  truthy, FALSE when falsy, UNKNOWN when ``None``; compared (``WHERE f(x) > 3``) or computed
  on it is an ordinary value.
- Names are case-insensitive (SQL function names are) and must be identifiers that sqlglot
  reads as an unknown function: built-in names such as ``upper`` are refused here, at
  registration, rather than silently never called.
- An exception raised by the function reaches the caller as :class:`UDFError`, which names
  the UDF (the original exception is its ``__cause__``).
- A UDF should be deterministic and free of side effects: the engine may call it more than
  once per row (e.g. for ``NOT (f(x) BETWEEN 1 AND 3)``, or once per query that uses it).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping

from adaptcq.errors import AdaptcqError, OptionError

UDFs = Mapping[str, Callable[..., object]]
"""A mapping from UDF name to its Python callable (the type of every ``udfs=`` argument)."""

_DEFAULT: dict[str, Callable[..., object]] = {}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SYMBOL_PREFIX = "_udf_"


class UDFError(AdaptcqError):
    """A user-defined function raised while a query evaluated it: ``name`` is the UDF,
    ``error`` what it raised (also the ``__cause__``)."""

    def __init__(self, name: str, error: BaseException):
        self.name = name
        self.error = error
        super().__init__(f"UDF {name!r} raised {type(error).__name__}: {error}")


def register_udf(name: str, fn: Callable[..., object], *,
                 registry: dict[str, Callable[..., object]] | None = None
                 ) -> Callable[..., object]:
    """Make ``fn`` callable from SQL as ``name(...)``; returns ``fn``.

    ``registry`` is the dict to register into (the process-wide default one when None).
    Registering a name again replaces the function; queries compiled before keep the old
    one. Raises :class:`~adaptcq.errors.OptionError` for a name that is not an identifier
    or that SQL already gives a meaning, and ``TypeError`` when ``fn`` is not callable.
    """
    key = check_udf_name(name)
    if not callable(fn):
        raise TypeError(f"UDF {name!r}: {fn!r} is not callable")
    target = _DEFAULT if registry is None else registry
    for other in [k for k in target if k.lower() == key and k != key]:
        del target[other]  # one entry per case-insensitive name
    target[key] = fn
    return fn


def unregister_udf(name: str, *, registry: dict[str, Callable[..., object]] | None = None
                   ) -> None:
    """Remove ``name`` from ``registry`` (the default one when None); absent is fine."""
    target = _DEFAULT if registry is None else registry
    for key in [k for k in target if k.lower() == name.lower()]:
        del target[key]


def default_registry() -> dict[str, Callable[..., object]]:
    """The process-wide registry itself (``register_udf`` without ``registry=``)."""
    return _DEFAULT


def resolve_udfs(udfs: UDFs | None) -> dict[str, Callable[..., object]]:
    """``udfs`` checked and keyed by lower-case name; None means the default registry
    (a snapshot: later registrations do not change what was resolved)."""
    source = _DEFAULT if udfs is None else udfs
    out: dict[str, Callable[..., object]] = {}
    for name, fn in source.items():
        key = check_udf_name(name)
        if not callable(fn):
            raise TypeError(f"UDF {name!r}: {fn!r} is not callable")
        if key in out and out[key] is not fn:
            raise OptionError(f"two UDFs are named {name!r} (names are case-insensitive)")
        out[key] = fn
    return out


def udf_symbol(name: str) -> str:
    """The Python name under which compiled code calls UDF ``name``. The prefix keeps it
    apart from every other name in generated code (``r``, ``_k0``, ``datetime``...)."""
    return _SYMBOL_PREFIX + name.lower()


def udf_namespace(udfs: Mapping[str, Callable[..., object]]) -> dict[str, Callable]:
    """``{udf_symbol(name): wrapper}`` for resolved ``udfs``: each wrapper calls the UDF and
    turns what it raises into a :class:`UDFError` naming it."""
    return {udf_symbol(name): _wrap(name, fn) for name, fn in udfs.items()}


def check_udf_name(name: str) -> str:
    """The lower-case key of a valid UDF name; :class:`OptionError` otherwise."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise OptionError(f"UDF name {name!r} is not an identifier (letters, digits and _, "
                          "not starting with a digit)")
    builtin = _builtin_meaning(name)
    if builtin is not None:
        raise OptionError(f"UDF name {name!r} cannot be used: SQL reads {name}(...) as "
                          f"{builtin}; choose another name")
    return name.lower()


@functools.lru_cache(maxsize=1024)  # names are checked at every parse and compile
def _builtin_meaning(name: str) -> str | None:
    """What sqlglot makes of ``name(x)`` when it is not an unknown (user) function."""
    import sqlglot
    import sqlglot.expressions as exp
    from sqlglot.errors import ParseError, TokenError
    try:
        item = sqlglot.parse_one(f"SELECT {name}(x)").expressions[0]
    except (ParseError, TokenError):
        return "a keyword"
    if isinstance(item, exp.Anonymous) and item.name.lower() == name.lower():
        return None
    if isinstance(item, exp.Func):
        return f"the built-in function {item.sql_name()}"
    return f"{type(item).__name__} ({item.sql()})"


def _wrap(name: str, fn: Callable[..., object]) -> Callable[..., object]:
    def call(*args: object) -> object:
        try:
            return fn(*args)
        except Exception as e:  # re-raised, naming the UDF
            raise UDFError(name, e) from e

    call.__name__ = call.__qualname__ = f"udf_{name}"
    call.udf = fn
    return call


def calls_udf(outputs, udfs: Mapping[str, Callable[..., object]]) -> bool:
    """Whether a SELECT list (``LogicalQuery.outputs``) calls one of ``udfs``."""
    import sqlglot.expressions as exp
    names = {n.lower() for n in udfs}
    return any(isinstance(node, exp.Anonymous) and node.name.lower() in names
               for o in outputs for node in o.expr.walk())


def guarded_output(fail: Callable[[str], None], emit: Callable, *projections: Callable
                   ) -> tuple[Callable, ...]:
    """(emit, *projections) for a query whose SELECT list calls a UDF, so that a UDF
    raising (or returning what cannot be compared) there fails that query alone, as one
    raising in a WHERE does (docs/cacq.md): ``fail(message)`` is told once, the row is not
    emitted, and neither is any later one. The projections may take any arguments (the
    eddy has one over a dict of components and one over them positionally). A query
    without UDFs in its SELECT keeps its plain functions (no call more per result)."""
    failed: list = []

    def guard(project):
        def project_(*args):
            if failed:
                return ()
            try:
                return project(*args)
            except Exception as e:  # noqa: BLE001 - the UDF's (or its comparison's) error
                failed.append(e)
                fail(str(e) if isinstance(e, UDFError) else
                     f"a SELECT item raised {type(e).__name__}: {e}")
                return ()
        return project_

    def emit_(row):
        if not failed:
            emit(row)
    return (emit_, *(guard(p) for p in projections))
