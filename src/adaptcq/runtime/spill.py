"""The operator tree's spilling for one local run (state-spill.txt; docs/spill.md): the
options checked, the spill store and policy built, the clean-up at the end of the input,
the run summary's figures, and ``adaptcq cleanup`` for a spill folder left behind.

Options (the ``spill`` keyword of ``adaptcq.run``/``stream``; ``adaptcq run --spill ...``):

=============  ===========================================================================
strategy       bottom-up, local-output, global-output or global-penalty (§3); with memory
memory         the state budget, bytes or a size such as "512MB" (§2.2's model)
fraction       f: a spill frees this fraction of the budget (default 0.2)
every          k: insertions between two memory checks (default 1,000)
partitions     partition ids per operator (default 300, §6.1)
directory      where spilled generations go (default: a temporary folder)
sample         the fraction of results traced for the global statistics (default 0.1)
seed           the seed of the sampling and of bottom-up's random choice (an integer;
               a local run refuses it for local-output, which draws nothing)
cleanup        "end" (default): produce the held-back results at the end of the input;
               "off": leave them on disk (every group is written) for `adaptcq cleanup`
when_free      clean up while running once the spilled state fits again: True (default
               with cleanup "end") or False (--cleanup never-while-running)
=============  ===========================================================================
"""

from __future__ import annotations

import base64
import hashlib
import json
import numbers
import os
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa

from adaptcq.checks import is_int
from adaptcq.errors import AdaptcqError, OptionError
from adaptcq.query.logical import LogicalQuery
from adaptcq.stats.partitions import check_partitions

CHUNK = 65_536  # late results per batch written by ``adaptcq cleanup``

KEYS = ("strategy", "memory", "fraction", "every", "partitions", "directory", "sample", "seed",
        "cleanup", "when_free")


# The spill options that only tune spilling, by their command-line flags.
_TUNING = {"partitions": "--spill-partitions", "fraction": "--spill-fraction",
           "every": "--spill-check", "sample": "--spill-sample", "cleanup": "--cleanup",
           "when_free": "--cleanup"}


def _checked(spill: dict | None) -> dict:
    """The checks every ``spill`` option gets, locally or on Spark: known keys, a strategy
    and a budget together, the lineage sample in [0, 1], the seed an integer. Returns a
    copy."""
    if spill is not None and not isinstance(spill, Mapping):  # (dict() raised a raw error)
        raise OptionError(f"spill must be a dict of spill options, e.g. spill={{'strategy': "
                          f"'global-penalty', 'memory': '64MB'}}; got {spill!r}")
    spill = dict(spill or {})
    unknown = sorted(set(spill) - set(KEYS))
    if unknown:
        raise OptionError(f"unknown spill option {unknown[0]!r}; the options are: "
                          f"{', '.join(KEYS)}")
    if (spill.get("strategy") is None) != (spill.get("memory") is None):
        raise OptionError("--spill STRATEGY and --memory BUDGET go together: a strategy "
                          "chooses what to spill when the state passes the budget")
    tuning = [flag for key, flag in _TUNING.items() if spill.get(key) is not None]
    if spill.get("strategy") is None and tuning:  # (they would change nothing)
        raise OptionError(f"{', '.join(dict.fromkeys(tuning))}: tune spilling, which needs "
                          "--spill STRATEGY and --memory BUDGET")
    sample = spill.get("sample", 0.1)
    if isinstance(sample, bool) or not isinstance(sample, numbers.Real) or \
            not 0 <= sample <= 1:
        raise OptionError(f"--spill-sample (the fraction of results traced) must be in "
                          f"[0, 1], got {sample!r}")
    if spill.get("sample") is not None and spill.get("strategy") in ("bottom-up",
                                                                     "local-output"):
        why = ("chooses partition groups at random" if spill["strategy"] == "bottom-up" else
               "counts each operator's own output")
        raise OptionError(f"--spill-sample: --spill {spill['strategy']} {why} and traces no "
                          "sample of results; the sample is for --spill global-output and "
                          "global-penalty")
    if spill.get("partitions") is not None:
        check_partitions(spill["partitions"], "--spill-partitions")
    if "seed" in spill and not is_int(spill["seed"]):  # (True or 1.5 would become 1)
        raise OptionError(f"spill option seed must be an integer, got {spill['seed']!r}")
    directory = spill.get("directory")
    if directory is not None and (not isinstance(directory, (str, os.PathLike)) or
                                  not str(directory).strip()):
        # (a number was a raw TypeError; "" would be the current folder)
        raise OptionError(f"spill option directory (--spill-dir) must be a folder's path, "
                          f"got {directory!r}")
    return spill


def _seed_refusal(spill: dict) -> None:
    """A seed that nothing random would use is refused, as the CLI refuses ``--seed``
    there (``cliargs.seed_refusal``): local-output ranks partition groups by each
    operator's own output, and without a strategy nothing spills."""
    if "seed" not in spill:
        return
    strategy = spill.get("strategy")
    if strategy is None or strategy == "local-output":
        why = ("--spill local-output ranks partition groups deterministically" if strategy
               else "without --spill STRATEGY nothing spills")
        raise OptionError(f"spill seed {spill['seed']}: nothing random uses it ({why}); it "
                          "seeds --spill bottom-up's random choice and global-output's and "
                          "global-penalty's sample of results")


def _cleanup_mode(spill: dict) -> tuple[str, bool]:
    """(cleanup, when_free), checked: "end" (clean up at the end of the input, and by
    default while running when memory frees up) or "off" (leave the held-back results for
    `adaptcq cleanup`, so no clean-up while running either)."""
    cleanup = spill.get("cleanup", "end")
    if cleanup not in ("end", "off"):
        raise OptionError(f"--cleanup {cleanup!r}: choose end or off")
    when_free = spill.get("when_free", cleanup == "end")
    if not isinstance(when_free, bool):  # ("no" or "false" would be true)
        raise OptionError(f"spill option when_free (clean up while running once memory "
                          f"frees up) must be True or False, got {when_free!r}")
    if when_free and cleanup == "off":
        raise OptionError("--cleanup off leaves every held-back result for `adaptcq "
                          "cleanup`: it cannot also clean up while running")
    return cleanup, when_free


def spill_executor(executor: str) -> str:
    """The executor a spilling run uses: the operator tree ("auto" chooses it, as
    ``runtime.local.choose_executor`` does); any other is refused with the reason."""
    if executor not in ("auto", "tree"):
        raise OptionError(f"spilling (--spill) is done by the operator tree (--executor "
                          f"tree), not by --executor {executor}")
    return "tree"


def spill_figures(ex) -> dict:
    """A spilling tree's figures for the run summary (local, and per Spark group)."""
    c = ex.counters
    return {"spills": c.spills, "partition_groups_spilled": c.groups_spilled,
            "spilled_bytes_model": c.spilled_bytes, "spill_file_bytes": c.file_bytes,
            "cleanups": c.cleanups, "cleanup_cpu_seconds": round(c.cleanup_seconds, 4),
            "end_cleanup_cpu_seconds": round(c.end_cleanup_seconds, 4),
            "late_results": c.late_results, "cleanup_handovers": c.handover_flushes,
            "cleanup_writebacks": c.writebacks,
            "cleanup_writeback_bytes_model": c.writeback_bytes,
            "cleanup_batch_runs": c.batch_runs, "cleanup_python_runs": c.python_runs,
            "memory_model_now": int(ex.memory_usage())}


def spark_spill_spec(spill: dict, groups: int) -> dict:
    """The ``spill`` option of a Spark run, checked on the driver, as every partition group
    builds its spilling from it (``runtime.spark_group``; docs/spill.md, "On Spark"): the
    budget is the query's, split evenly over the ``groups`` (each group's engine keeps its
    state under ``memory / groups``); ``directory`` is where the groups' folders go (under
    the checkpoint: ``run_files`` puts it there). Refused, with the reason: a missing
    strategy, budget or folder; ``cleanup="off"`` with clean-ups while running. With
    ``cleanup="off"`` the groups keep what their spills hold back past the end of the
    input, for ``adaptcq cleanup CHECKPOINT`` (``spark.signal_cleanup``)."""
    from adaptcq.adapt.spilling import SpillPolicy, parse_bytes
    spill = _checked(spill)
    if spill.get("strategy") is None:
        raise OptionError("spilling needs --spill STRATEGY and --memory BUDGET")
    _seed_refusal(spill)
    cleanup, when_free = _cleanup_mode(spill)
    if spill.get("directory") is None:
        raise OptionError("spilling on Spark needs a folder for the spilled generations "
                          "(spill={'directory': ...}), next to the query's checkpoint and "
                          "kept with it; `adaptcq run --engine spark` puts it in the "
                          "checkpoint")
    total = parse_bytes(spill["memory"])
    budget = total // groups
    if budget < 1:
        raise OptionError(f"--memory {spill['memory']!r} split over {groups} partition "
                          "groups leaves less than a byte each")
    partitions = spill.get("partitions", 300)  # (checked by _checked)
    out = {"strategy": spill["strategy"], "memory": total, "budget": budget,
           "fraction": spill.get("fraction", 0.2), "every": spill.get("every", 1000),
           "partitions": partitions, "sample": float(spill.get("sample", 0.1)),
           "seed": spill.get("seed", 0),
           "when_free": when_free, "cleanup": cleanup,
           "directory": str(spill["directory"])}
    SpillPolicy(out["strategy"], budget, fraction=out["fraction"], every=out["every"])
    return out


# What a spill manifest's fingerprint covers: everything ``adaptcq cleanup`` rebuilds the
# operator tree and the output from (``SpillSetup.finish``).
_FINGERPRINTED = ("sql", "tree", "partitions", "time_unit", "timestamp_unit", "kinds",
                  "types", "output_schema")


def manifest_fingerprint(meta: dict) -> str:
    """The fingerprint of a spill manifest's ``meta`` (the query, plan, partitions, time
    units and schemas): a SHA-256 of their canonical JSON, checked by ``adaptcq cleanup``
    so that a manifest edited to another valid query or plan is refused, not cleaned up
    into wrong results."""
    doc = json.dumps({k: meta.get(k) for k in _FINGERPRINTED}, sort_keys=True)
    return "meta-sha256:" + hashlib.sha256(doc.encode()).hexdigest()


def _plan_text(tree) -> str:
    """A plan as ``parse_plan`` reads it back."""
    return tree if isinstance(tree, str) else "(" + ", ".join(map(_plan_text, tree)) + ")"


class SpillSetup:
    """One run's spill options, store and policy (see the module docstring)."""

    def __init__(self, query: LogicalQuery, spill: dict | None, types: dict,
                 timestamp_unit: str | None, schema: pa.Schema,
                 kinds: dict[str, dict[str, str]] | None = None):
        spill = _checked(spill)
        self.query = query
        # every source's columns in their input's order (``adaptcq cleanup`` parses the
        # query again: a SELECT * must expand to the same columns in the same order)
        self.kinds = kinds
        self.strategy = spill.get("strategy")
        memory = spill.get("memory")
        self.cleanup, when_free = _cleanup_mode(spill)
        directory = spill.get("directory")
        if self.cleanup == "off" and directory is None:
            raise OptionError("--cleanup off leaves the spilled state on disk for "
                              "`adaptcq cleanup`: give the folder with --spill-dir")
        if directory is not None and self.strategy is None:
            raise OptionError("--spill-dir needs --spill STRATEGY and --memory BUDGET")
        self.partitions = spill.get("partitions", 300)
        self.sample = float(spill.get("sample", 0.1))
        _seed_refusal(spill)
        self.seed = spill.get("seed", 0)
        self.schema = schema
        self.unit = timestamp_unit
        self.types = types
        self.policy = self.store = None
        self.discarded = False  # the spill files removed: the run did not finish
        if self.strategy is not None:
            from adaptcq.adapt.spilling import SpillPolicy
            from adaptcq.state.spill_store import SpillStore
            self.policy = SpillPolicy(self.strategy, memory,
                                      fraction=spill.get("fraction", 0.2),
                                      every=spill.get("every", 1000), seed=self.seed,
                                      cleanup_when_free=when_free)
            self.store = SpillStore(directory, query.columns, types, fresh=True,
                                    time_type=pa.int64())  # the runtime's times: int64 ns

    def engine_options(self) -> dict:
        return {"partitions": self.partitions, "store": self.store, "spill": self.policy,
                "late_column": True, "sample": self.sample, "seed": self.seed}

    def finish(self, cq):
        """The end of the input: the clean-up (``cleanup="end"``), or every group in memory
        written as a last spill event with what ``adaptcq cleanup`` needs
        (``cleanup="off"``). A generator: the clean-up pauses after each partition group,
        so that the caller passes on the late results emitted so far."""
        ex = cq.executor
        if self.store is None:
            return
        if self.cleanup == "end":
            if ex.pending():
                yield from ex.cleanup_steps(final=True)
            return
        self.store.meta = {
            "sql": self.query.sql, "tree": _plan_text(ex.tree), "partitions": ex.partitions,
            "time_unit": ex.time_unit, "timestamp_unit": self.unit,
            "kinds": self.kinds or {
                s.source: {c: k for c, k in self.query.types.get(s.alias, {}).items()}
                for s in self.query.streams},
            "types": {a: base64.b64encode(t.serialize().to_pybytes()).decode()
                      for a, t in self.types.items()},
            "output_schema": base64.b64encode(self.schema.serialize().to_pybytes()).decode(),
        }
        self.store.fingerprint = manifest_fingerprint(self.store.meta)
        groups = [(op.id, pid) for op in ex.ops for pid in op.parts]
        spills = ex.counters.spills
        if groups:
            ex.spill(groups)
        if ex.counters.spills == spills:
            # No last spill event (nothing in memory, or only groups whose inputs all
            # ended): the manifest still needs the query, or `adaptcq cleanup` refuses it.
            self.store._save()

    def close(self, finished: bool = True) -> None:
        """At the end of the run. A run that did not finish (an error, a result bound, a
        refusal) cannot clean up what it spilled — the groups in memory are gone — so its
        spill files are removed rather than left for a clean-up that could only be
        partial, with the manifest and folders the run made (``SpillStore.discard``): a
        refused run leaves no empty spill folder behind."""
        if self.store is None:
            return
        if not finished:
            self.store.discard()
            self.discarded = True
        if self.cleanup == "end" or not finished:
            self.store.close()

    def report(self, cq, last_ts) -> dict:
        """The summary's spill figures. ``complete_until`` (seconds of event time, an
        exclusive bound: every result with ``_ts`` < it is in the output) and
        ``spill_folder`` only for a run whose spills were cleaned up or left on disk whole
        (docs/spill.md, "Clean-up"): one that did not finish (``--max-results``, an error,
        its consumer closing it) has its output cut and its spill files removed
        (``close``), so neither would be true."""
        ex = cq.executor
        c = ex.counters
        out = {"plan_operators": [op.describe() for op in reversed(ex.ops)],
               "partitions_per_operator": ex.partitions}
        if self.policy is None:
            return out
        out.update(self.policy.report())
        out.update(spill_figures(ex))
        if last_ts is not None and not self.discarded:
            # Exclusive: every result with _ts before the oldest spill not yet cleaned up
            # is out; one at that very time may still be held back (a later arrival of
            # the same time joins the spilled groups). After a clean-up: the input's end,
            # and every result is out.
            pending = c.first_pending
            out["complete_until"] = (pending if pending is not None else last_ts) / 1e9
            if pending is not None:
                out["spill_folder"] = str(self.store.directory)
        return out


def cleanup_folder(directory: str, output: str, fmt: str | None = None) -> dict:
    """``adaptcq cleanup DIR --output OUT``: produce the results held back in a spill folder
    left by ``adaptcq run --spill ... --cleanup off`` (Eq. 3 over every spilled generation,
    §4.2's order), write them to OUT (late rows: ``_late`` true), and empty the folder.

    OUT inside the folder is refused before anything is read (the output's writing would
    replace a spill file or the manifest: the late results lost for good), and a damaged
    manifest is refused naming it and what is wrong. The folder is emptied only once OUT is
    written and closed: a failed write (a full disk) leaves it whole, for a retry."""
    from adaptcq.runtime.local import (
        late_table_fits,
        rows_to_batch,
        table_rows,
        table_to_schema,
    )
    from adaptcq.runtime.output import FileSink, check_output_path, format_of, overlaps
    from adaptcq.state.spill_store import MANIFEST, SpillError, SpillStore

    folder = Path(directory)
    if not folder.exists():
        raise AdaptcqError(f"{directory!r} does not exist; give the --spill-dir of a run "
                           "with --cleanup off")
    if not folder.is_dir():
        raise AdaptcqError(f"{directory!r} is a file, not a spill folder; give the "
                           "--spill-dir of a run with --cleanup off")
    if not (folder / MANIFEST).exists():
        raise AdaptcqError(f"{directory!r} is not a spill folder (no {MANIFEST}); it is the "
                           "--spill-dir of a run with --cleanup off")
    if output != "-":
        if overlaps(output, folder):
            raise AdaptcqError(
                f"--output {output!r} is inside the spill folder {directory!r} (or is it, "
                "or holds it), which adaptcq cleanup reads and then empties: writing there "
                "would destroy the spilled results; give a place outside it")
        check_output_path(output, [])
    form = format_of(output, fmt)
    probe = SpillStore(folder, {})
    meta = probe.meta
    if not meta.get("sql"):
        raise SpillError(f"spill folder {directory} has no query recorded: it was left by a "
                         "run that did not finish (only `--cleanup off` runs leave one)")
    # Held: the folder is emptied once the output is closed (below), not by the clean-up.
    schema, ex = _cleanup_tree(folder / MANIFEST, meta,
                               lambda q, types: SpillStore(folder, q.columns, types, hold=True))
    store = ex.store
    # (A folder written before manifests had a fingerprint records "": not checked.)
    if probe.fingerprint and probe.fingerprint != manifest_fingerprint(meta):
        raise SpillError(f"spill manifest {folder / MANIFEST} is damaged: its 'meta' (the "
                         "query, plan, partitions or schemas) is not the one its fingerprint "
                         "records; the spilled results cannot be produced")
    unlisted = store.unlisted()
    if unlisted:
        raise SpillError(
            f"spill folder {directory} holds spill files its manifest does not list "
            f"({', '.join(unlisted[:5])}{' ...' if len(unlisted) > 5 else ''}): the manifest "
            "was edited, so the spilled results cannot be produced exactly (if an earlier "
            "`adaptcq cleanup` of this folder wrote its output and stopped before removing "
            "them, remove them)")
    sink = FileSink(output, schema, form)
    rows: list = []
    written = 0

    def emit(row) -> None:  # late results leave as they are produced, a chunk at a time
        nonlocal written
        rows.append(row)
        if len(rows) >= CHUNK:
            sink.write(rows_to_batch(rows, schema, meta.get("timestamp_unit")))
            written += len(rows)
            rows.clear()

    def emit_table(t: pa.Table) -> None:  # a batch clean-up's late results, as Arrow
        nonlocal written
        if not late_table_fits(t, schema):
            for row in table_rows(t):
                emit(row)
            return
        for b in table_to_schema(t, schema, meta.get("timestamp_unit")).to_batches(
                max_chunksize=CHUNK):
            sink.write(b)
        written += t.num_rows

    ex.set_emit(emit)
    ex.emit_table = emit_table
    try:
        ex.cleanup(final=True)
        if rows:
            sink.write(rows_to_batch(rows, schema, meta.get("timestamp_unit")))
            written += len(rows)
        sink.close()
    except BaseException:
        sink.abort()
        raise
    try:
        store.release()  # the late results are in OUT: the folder can go
    except SpillError as e:
        where = "stdout" if output == "-" else output
        raise SpillError(f"the {written:,} late results were written to {where}, but the "
                         f"spill folder {directory} could not be emptied ({e}); remove its "
                         "spill files: adaptcq cleanup on it again would write them "
                         "again") from None
    return {"late_results": written, "cleanup_cpu_seconds": ex.counters.cleanup_seconds,
            "fingerprint": hashlib.sha256(meta["sql"].encode()).hexdigest()[:12]}


def _cleanup_tree(manifest: Path, meta: dict, make_store) -> tuple:
    """The output schema and operator tree that ``adaptcq cleanup`` rebuilds from a
    spill manifest's ``meta`` (``SpillSetup.finish`` wrote it), its store made by
    ``make_store(query, types)``. A manifest damaged or edited by hand is refused naming it
    and what is wrong (a raw KeyError or a plan's ValueError otherwise)."""
    import binascii

    from adaptcq.engine.spill_tree import SpillTree, parse_plan
    from adaptcq.query.cql import parse_query
    from adaptcq.state.spill_store import SpillError

    def damaged(what: str) -> SpillError:
        return SpillError(f"spill manifest {manifest} is damaged: {what}; the spilled "
                          "results cannot be produced")

    missing = [k for k in ("sql", "tree", "partitions", "time_unit", "kinds", "types",
                           "output_schema") if k not in meta]
    if missing:
        raise damaged(f"its 'meta' has no {', '.join(map(repr, missing))}")
    if not isinstance(meta["types"], dict) or not isinstance(meta["kinds"], dict):
        raise damaged("its 'meta' 'types' and 'kinds' must be objects")

    def schema_of(text, what: str) -> pa.Schema:
        try:
            return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text, validate=True)))
        except (TypeError, ValueError, binascii.Error, pa.ArrowException) as e:
            raise damaged(f"{what} cannot be read ({e})") from None

    types = {a: schema_of(t, f"the schema of stream {a!r}") for a, t in meta["types"].items()}
    schema = schema_of(meta["output_schema"], "the output schema")
    try:
        query = parse_query(meta["sql"], meta["kinds"])
    except (AdaptcqError, TypeError, ValueError, AttributeError) as e:
        # (a QueryError's first line names the place; the query and caret follow it)
        raise damaged(f"its query cannot be parsed ({str(e).splitlines()[0]})") from None
    store = make_store(query, types)
    try:
        tree = parse_plan(meta["tree"])
        ex = SpillTree(query, tree=tree, partitions=meta["partitions"],
                       time_unit=meta["time_unit"], store=store, late_column=True)
    except (AdaptcqError, TypeError, ValueError) as e:
        raise damaged(f"its plan {meta['tree']!r} (partitions {meta['partitions']!r}, "
                      f"time unit {meta['time_unit']!r}) does not fit its query ({e})") \
            from None
    return schema, ex
