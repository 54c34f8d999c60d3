"""Where results go as they are produced: Parquet, CSV or JSON lines, files or stdout.

A file is written under a temporary name beside its destination and renamed into place
when the run ends (or is interrupted with Ctrl-C, after closing it properly), so a killed run
never leaves a corrupt or half-written file at the output path. A stale file from an
earlier run is removed when the run starts, so an old output never looks current.
Output paths are checked before any work: an output that is an input (or inside one) is
refused, as is a folder, or a place that cannot be written. A path is taken as written, as
the inputs' are: a ``~`` the shell did not expand (``--output=~/o.csv``) is not the home
folder, and is refused unless a folder of that name exists. The folders a check creates are
recorded (:data:`MADE_FOLDERS`) so that a run refused later removes them
(:func:`remove_made_folders`).

The format comes from ``--format`` or the file's suffix (:data:`SUFFIXES`; ``.gz`` after a
CSV or JSON-lines suffix gzip-compresses the file; no suffix is Parquet); a suffix that
names no format is refused rather than written as Parquet under a misleading name.
JSON lines are valid JSON: a NaN or infinite float is written as the string ``"NaN"``,
``"Infinity"`` or ``"-Infinity"`` (the Protocol Buffers JSON mapping's convention), bytes
as hex.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa

from adaptcq.errors import AdaptcqError
from adaptcq.paths import make_folders

FORMATS = ("parquet", "csv", "jsonl")


class OutputClosed(AdaptcqError):
    """The reader of stdout went away (``adaptcq run --output - | head``)."""


SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl",
            ".ndjson": "jsonl", ".json": "jsonl"}
"""Output file suffixes and their formats; CSV and JSON lines may add ``.gz`` (gzip)."""


def _suffix(path: str) -> tuple[str, bool]:
    """The file name's format suffix (lower case, '' if none) and whether ``.gz`` follows
    it (the folder's name plays no part)."""
    name = Path(path).name.lower()
    gz = name.endswith(".gz")
    if gz:
        name = name[:-len(".gz")]
    return Path(name).suffix, gz


def format_of(path: str | None, fmt: str | None, what: str = "--output") -> str:
    """The output format: ``fmt`` if given, else from the file's suffix (a name with no
    suffix is Parquet; stdout is CSV). A suffix that names no format is refused, as is
    ``.gz`` on Parquet (which compresses inside the file)."""
    if fmt is not None and fmt not in FORMATS:
        raise AdaptcqError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if path in (None, "-"):
        return fmt or "csv"
    suffix, gz = _suffix(str(path))
    if fmt is None:
        fmt = SUFFIXES.get(suffix)
        if fmt is None and (suffix or gz):
            known = ", ".join(SUFFIXES)
            hint = "; or give --format parquet|csv|jsonl" if what == "--output" else ""
            raise AdaptcqError(
                f"{what} {str(path)!r}: {suffix + '.gz' if gz else suffix!r} is not an "
                f"output format's suffix; name the file {known} (CSV and JSON lines may "
                f"add .gz), or give it no suffix for Parquet{hint}")
        fmt = fmt or "parquet"
    if gz and fmt == "parquet":
        raise AdaptcqError(f"{what} {str(path)!r}: Parquet is compressed inside the file, "
                           "not with gzip; drop the .gz (or write CSV or JSON lines)")
    return fmt


def gzipped(path: str, fmt: str) -> bool:
    """A file of this name and format is gzip-compressed: CSV or JSON lines named .gz."""
    return path != "-" and fmt in ("csv", "jsonl") and _suffix(path)[1]


def overlaps(a: str | Path, b: str | Path) -> bool:
    """The two paths are one place, or one holds the other (after resolving links; a
    ``~`` is a name, as the writers and the local inputs take it)."""
    pa_, pb = Path(a).resolve(), Path(b).resolve()
    return pa_ == pb or pa_ in pb.parents or pb in pa_.parents


def refuse_overlaps(path: str, inputs: Iterable[Path], what: str,
                    others: Iterable[tuple[str, str]] = (), error=AdaptcqError) -> None:
    """Refuse (``error``) an output path that is an input, holds one or is inside one, or
    is (holds, is inside) another output (``others``: (its name, its path) pairs)."""
    out = Path(path)
    for p in inputs:
        if overlaps(out, p):
            raise error(f"{what} {path!r} is the input {str(p)!r} (or holds it, or is "
                        "inside it); writing there would destroy the input")
    for option, other in others:
        if overlaps(out, other):
            raise error(f"{what} {path!r} is {option} {other!r} (or holds it, or is "
                        "inside it); one would overwrite the other: give each a "
                        "place of its own")


def check_output_path(path: str, inputs: Iterable[Path], what: str = "--output",
                      others: Iterable[tuple[str, str]] = (),
                      example: str = "out.parquet") -> Path:
    """Refuse an output path that would destroy an input, that another output (``others``:
    (option, path) pairs) also writes, or that cannot be written: also a name ending with
    '/' (the finished file could not be renamed there: the whole run was lost) and a
    device, FIFO or socket (the file renamed into its place deleted it). A missing folder
    is made (and recorded in :data:`MADE_FOLDERS`, for a refusal to remove)."""
    out = Path(path)
    check_tilde(path, what)
    if what == "--rejected":  # (its format is always its suffix's: no --format for it)
        format_of(path, None, what)
    refuse_overlaps(path, inputs, what, others)
    if out.is_dir():
        raise AdaptcqError(f"{what} {path!r} is a folder; give a file name, e.g. "
                           f"{str(out / example)!r}")
    check_file_name(path, what, example)
    parent = out.parent
    if parent.exists() and not parent.is_dir():
        raise AdaptcqError(f"{what} {path!r}: {str(parent)!r} is a file, not a folder")
    try:
        make_folder(parent)
    except OSError as e:
        raise AdaptcqError(f"{what} {path!r}: cannot create its folder: "
                           f"{e.strerror or e}") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise AdaptcqError(f"{what} {path!r}: the folder {str(parent)!r} is not writable")
    return out


def check_file_name(path: str, what: str = "--output", example: str = "out.parquet",
                    error=AdaptcqError) -> None:
    """Refuse (``error``) a file output named with a trailing '/' (or '.', '..'), and one
    that is a device, FIFO or socket."""
    out = Path(path)
    base = os.path.basename(str(path))
    if base == "":  # (the finished file could not be renamed to NAME/: the run was lost)
        raise error(f"{what} {path!r} ends with '/', so it names a folder; give a file "
                    f"name: {str(out)!r} (without the '/') or a file inside it, e.g. "
                    f"{str(out / example)!r}")
    if base in (".", ".."):
        raise error(f"{what} {path!r} names a folder ({base!r}); give a file name, e.g. "
                    f"{str(out / example)!r}")
    stdout = "; - writes to stdout" if what == "--output" else ""
    kind = special_file(out)
    if kind is not None:
        raise error(f"{what} {path!r} is {kind}, not a regular file: an output is written "
                    "under a temporary name and renamed into place, which would replace "
                    f"it; give a file name{stdout}")
    # /dev/stdout, /dev/fd/N, /proc/self/fd/N lead to a descriptor's file, even a regular
    # one: the file renamed into place would replace the link (as root, /dev/stdout).
    folder = Path(os.path.realpath(out.parent))
    if folder == Path("/dev") or folder == Path("/proc") or Path("/proc") in folder.parents:
        raise error(f"{what} {path!r}: an output cannot go in {str(folder)!r}, among "
                    "devices and links to open files (renamed into place, it would "
                    f"replace one); give a file name{stdout}")


def check_tilde(path: str, what: str) -> None:
    """Refuse an output path that starts with a ``~`` folder that does not exist: the
    shell expands ``~`` only at the start of a word (not in ``--output=~/o.csv``), and
    adaptcq takes paths as written, as it does the inputs', so this would make a folder
    named ``~``. The checks and the writers take the same, unexpanded, path. (The rule of
    every path: ``sources.check_tilde_path``.)"""
    from adaptcq.stream.sources import check_tilde_path
    check_tilde_path(path, what, AdaptcqError)


MADE_FOLDERS: list[Path] = []
"""The folders :func:`make_folder` created in this process, in order, until
:func:`remove_made_folders` (a refused or failed run) or :func:`forget_made_folders`."""


def make_folder(folder: Path) -> None:
    """``folder`` and its missing parents, each one created recorded in
    :data:`MADE_FOLDERS`. Raises OSError."""
    make_folders(folder, MADE_FOLDERS)


def remove_made_folders() -> None:
    """A refused or failed run: the folders it made that are still empty are removed
    (deepest first), so that it leaves every file as it found it; never raises."""
    for d in reversed(MADE_FOLDERS):
        try:
            d.rmdir()  # (only an empty folder: what the run did not write to, or removed)
        except OSError:
            pass
    MADE_FOLDERS.clear()


def forget_made_folders() -> None:
    """A run that succeeded keeps its folders."""
    MADE_FOLDERS.clear()


def special_file(path: Path) -> str | None:
    """What ``path`` is when it is neither missing nor a regular file nor a folder (after
    links: /dev/stdout is the terminal or pipe it leads to): "a character device", "a
    FIFO"...; else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # missing (or a dangling link): a file is made
        return None
    for test, kind in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return None


def write_text(path: str, text: str) -> None:
    """``text`` to the file ``path`` as FileSink writes: under a temporary name beside it,
    fsynced, renamed into place; on failure the temporary is removed and an earlier file
    at ``path`` is left as it was (a full disk left an empty, invalid file). Raises
    OSError."""
    dest = Path(path)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


ROW_GROUP = 1 << 16  # rows per Parquet row group a FileSink writes (at most one pending)


def parquet_dictionary(schema: pa.Schema) -> list[str]:
    """The columns a results file dictionary-encodes: strings, binaries and Arrow
    dictionaries only. A join's numeric outputs (ids, keys, times) are mostly distinct, so
    a dictionary for them is built and then dropped for plain encoding: writing one of
    ``bench.spark_vs_native`` case b's micro-batches (214,285 rows of three ids, ``_sign``,
    ``_ts``) took 39 ms with dictionaries on every column and 16 ms with none, in a file
    25% smaller."""
    return [f.name for f in schema
            if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
            or pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)
            or pa.types.is_dictionary(f.type)]


class Sink:
    """Receives result (or rejected-row) batches of a fixed schema as they are produced."""

    rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Finish: the output is complete and valid at its destination."""

    def abort(self) -> None:
        """Give up after an error: nothing is left at the destination."""
        self.close()


class Collect(Sink):
    """Keeps the batches in memory (for ``adaptcq.run``'s ``RunResult.table``)."""

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self.batches: list[pa.RecordBatch] = []

    def write(self, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)
        self.rows += batch.num_rows

    def table(self) -> pa.Table:
        return pa.Table.from_batches(self.batches, schema=self.schema)


class FileSink(Sink):
    """A Parquet, CSV or JSON-lines file written atomically, or CSV / JSON lines to stdout."""

    def __init__(self, path: str, schema: pa.Schema, fmt: str, what: str = "--output"):
        self.path = path
        self.schema = schema
        self.fmt = fmt
        self.what = what
        self.stdout = path == "-"
        if self.stdout and fmt == "parquet":
            raise AdaptcqError("--output - (stdout) takes --format csv or jsonl, not parquet")
        if fmt == "csv":  # (before a file is made)
            _check_csv(schema, what)
        self.gzip = gzipped(path, fmt)
        self._tmp: Path | None = None
        self._writer = None
        self._file = None
        self._fd: int | None = None  # gzip: the temporary file's, for fsync once it is closed
        self._closed = False
        self._placed = False  # the finished file was renamed into place
        self._pending: list = []  # Parquet: batches not yet in a row group
        self._pending_rows = 0
        if self.stdout:
            self._file = sys.stdout.buffer
        else:
            dest = Path(path)
            try:
                dest.unlink(missing_ok=True)  # a stale output must not look current
            except OSError as e:
                raise AdaptcqError(f"{what} {path!r}: cannot remove the old file: "
                                   f"{e.strerror or e}") from None
            self._tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
            try:
                self._file = open(self._tmp, "wb")  # noqa: SIM115 - closed in close()
            except OSError as e:
                raise AdaptcqError(f"{what} {path!r}: cannot write: {e.strerror or e}") \
                    from None
            if self.gzip:
                # Closing the gzip stream writes its trailer and closes the file under it;
                # a duplicate of the file's descriptor syncs it to disk after that.
                self._fd = os.dup(self._file.fileno())
                self._file = pa.CompressedOutputStream(self._file, "gzip")
        self._guard(self._open_writer)

    def _open_writer(self) -> None:
        if self.fmt == "parquet":
            import pyarrow.parquet as pq
            self._writer = pq.ParquetWriter(
                self._file, self.schema, use_dictionary=parquet_dictionary(self.schema))
        elif self.fmt == "csv":
            import pyarrow.csv as pacsv
            self._writer = CsvWriter(self._file, self.schema) if _csv_floats(self.schema) \
                else pacsv.CSVWriter(self._file, self.schema)

    def _guard(self, fn, *args):
        try:
            return fn(*args)
        except BrokenPipeError:
            if not self.stdout:
                raise
            # Python would report the closed pipe again when it flushes stdout at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise OutputClosed("stdout was closed by its reader") from None
        except OSError as e:
            self._discard()
            where = "stdout" if self.stdout else repr(self.path)
            raise AdaptcqError(f"{self.what}: cannot write {where}: {e.strerror or e}") \
                from None

    def write(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        self.rows += batch.num_rows
        if self.fmt == "parquet":
            # A Parquet file is read only once it is closed (and renamed into place), so
            # its rows gather into row groups of ROW_GROUP rows: a run whose batches each
            # yield a few results otherwise wrote a row group per batch (the selective
            # chain of bench.vector: 150 row groups for 1,190 rows; cProfile put 2% of the
            # run in writing them, though the benchmark's CPU did not move measurably).
            self._pending.append(batch)
            self._pending_rows += batch.num_rows
            if self._pending_rows >= ROW_GROUP:
                self._guard(self._write, self._row_group())
            return
        self._guard(self._write, batch)

    def _row_group(self) -> pa.Table:
        """The pending Parquet batches as one table (then none is pending)."""
        table = pa.Table.from_batches(self._pending, schema=self.schema)
        self._pending, self._pending_rows = [], 0
        return table

    def _write(self, batch) -> None:
        """One batch (CSV, JSON lines) or one row group (Parquet: a table)."""
        if self.fmt == "parquet":
            self._writer.write_table(batch, row_group_size=max(ROW_GROUP, batch.num_rows))
            return
        if self.fmt == "jsonl":
            self._file.write(json_lines(_python_rows(batch)).encode())
        else:
            self._writer.write_batch(batch)
        if self.stdout:
            self._file.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._guard(self._finish)

    def _finish(self) -> None:
        if self._writer is not None:
            if self._pending:
                self._write(self._row_group())
            self._writer.close()
        if self.stdout:
            self._file.flush()
            return
        if self.gzip:
            self._file.close()
            fd, self._fd = self._fd, None
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
        os.replace(self._tmp, self.path)
        self._placed = True

    def abort(self) -> None:
        """Nothing left: the temporary file, and the finished one if it was already
        renamed into place (a later output of the run failed)."""
        self._closed = True
        self._discard()
        if self._placed:
            self._placed = False
            try:
                Path(self.path).unlink(missing_ok=True)
            except OSError:
                pass

    def _discard(self) -> None:
        self._pending, self._pending_rows = [], 0
        writer, self._writer = self._writer, None
        if writer is not None:
            try:  # release it now, while its file is open (its finalizer would write to it)
                writer.close()
            except (OSError, ValueError, pa.ArrowException):
                pass
        if self.stdout:
            return
        try:
            if self._file is not None and not self._file.closed:
                self._file.close()
        except (OSError, ValueError, pa.ArrowException):
            pass
        try:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)
            if self._tmp is not None:
                self._tmp.unlink(missing_ok=True)
        except OSError:
            pass


def _csv_floats(schema: pa.Schema) -> bool:
    """The schema has a float column (or a dictionary of floats)."""
    return any(pa.types.is_floating(f.type.value_type if pa.types.is_dictionary(f.type)
                                    else f.type) for f in schema)


class CsvWriter:
    """CSV exactly as pyarrow's ``CSVWriter`` writes it (its header of quoted names, a
    string quoted with its quotes doubled, NULL an empty field, every other value as Arrow
    casts it to text: that is how pyarrow's writer renders it), except for floats: pyarrow
    writes a whole float as ``2``, so a float column read back (by adaptcq's CSV input,
    whose types are inferred from the first rows, or any reader) was int64, and a later
    ``0.5`` in it stopped that run. Here a whole float keeps its decimal point (``2.0``,
    ``-0.0``); every float is Arrow's shortest text that reads back as the same value
    (``0.1``, ``1e+20``, ``nan``, ``inf``). Used only for a schema with a float column."""

    def __init__(self, file, schema: pa.Schema):
        self.file = file
        self.schema = schema
        file.write(("," .join(_csv_quote(n) for n in schema.names) + "\n").encode())

    def write_batch(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        import numpy as np
        import pyarrow.compute as pc
        fields = [_csv_field(col) for col in batch.columns]
        line = pc.binary_join_element_wise(*fields, _LARGE(","))
        line = pc.binary_join_element_wise(line, _LARGE(""), _LARGE("\n"))  # (line + "\n")
        # The rows' text lies end to end in the array's data buffer: written in one piece.
        offsets = np.frombuffer(line.buffers()[1], dtype=np.int64, count=len(line) + 1,
                                offset=line.offset * 8)
        start, end = int(offsets[0]), int(offsets[-1])
        self.file.write(line.buffers()[2].slice(start, end - start))

    def close(self) -> None:
        """(The file is the sink's to close.)"""


def _LARGE(text: str) -> pa.Scalar:
    return pa.scalar(text, pa.large_string())


def _csv_quote(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def _csv_field(col: pa.Array) -> pa.Array:
    """One column's CSV fields (large_string, no NULL: a NULL is an empty field)."""
    import pyarrow.compute as pc
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    t = col.type
    text = pc.cast(col, pa.large_string())
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        text = pc.binary_join_element_wise(
            _LARGE('"'), pc.replace_substring(text, '"', '""'), _LARGE('"'), _LARGE(""))
    elif pa.types.is_floating(t):
        # Arrow's shortest round-trip text; a whole number ("2", "-0", never "1e+16",
        # which has its exponent) gets ".0" so that it reads back as a float.
        whole = pc.match_substring_regex(text, r"^-?[0-9]+$")
        text = pc.if_else(whole, pc.binary_join_element_wise(text, _LARGE(".0"), _LARGE("")),
                          text)
    return pc.fill_null(text, _LARGE(""))


def _check_csv(schema: pa.Schema, what: str) -> None:
    """Refuse what CSV cannot hold: lists, structs and maps, and bytes (pyarrow's CSV writer
    stops at the first value that is not UTF-8, in the middle of the run)."""
    def cannot(t: pa.DataType) -> bool:
        if pa.types.is_dictionary(t):
            t = t.value_type
        return (pa.types.is_nested(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
                or pa.types.is_binary_view(t))
    bad = [f for f in schema if cannot(f.type)]
    if bad:
        cols = ", ".join(f"{f.name!r} ({f.type})" for f in bad)
        raise AdaptcqError(f"{what}: CSV cannot hold column{'s' if len(bad) > 1 else ''} "
                           f"{cols}; write Parquet or JSON lines (--format parquet|jsonl, or "
                           "a .parquet / .jsonl name; JSON lines write bytes as hex)")


def _python_rows(batch) -> list[dict]:
    """A batch's rows as Python values for JSON lines; a value Python cannot hold exactly (a
    date past the year 9999 raised a bare OverflowError, a time64[ns] lost its last digits)
    is refused, naming its column."""
    from adaptcq.stream.merge import python_misfit
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        why = python_misfit(col)
        if why is not None:
            raise AdaptcqError(f"--format jsonl: output column {name!r} ({col.type}) has a "
                               f"value {why}; JSON lines are written through Python values: "
                               "write Parquet or CSV")
    return batch.to_pylist()


def json_lines(rows: list[dict]) -> str:
    """Rows as JSON lines. A NaN or infinite float, at any depth, is written as the
    string "NaN", "Infinity" or "-Infinity" (bare NaN / Infinity tokens are not JSON); only a
    row that holds one is rebuilt for it."""
    encode = _JSON.encode
    out = []
    for r in rows:
        try:
            out.append(encode(r))
        except ValueError:  # "Out of range float values are not JSON compliant"
            out.append(encode(_nonfinite(r, _json_token)))
        out.append("\n")
    return "".join(out)


def _nonfinite(v, replace):
    """``v`` with each non-finite float (in dicts and lists too) as ``replace`` gives it."""
    if isinstance(v, float):
        return v if math.isfinite(v) else replace(v)
    if isinstance(v, dict):
        return {k: _nonfinite(x, replace) for k, x in v.items()}
    if isinstance(v, (list, tuple)):  # (rows from Arrow hold no sets)
        return [_nonfinite(x, replace) for x in v]
    return v


def _json_token(v: float) -> str:
    return "NaN" if math.isnan(v) else _NONFINITE[v]


def summary_json(doc, indent: int = 1) -> str:
    """A run's figures as JSON text (``--summary-json``), always valid JSON: a non-finite
    number (the throughput of a run that took no CPU time, a NaN) is a figure that does not
    exist and is written as null; a value JSON has no type for is written as its ``str``."""
    return json.dumps(_nonfinite(doc, lambda _: None), indent=indent, default=str,
                      allow_nan=False)


def _json_value(v):
    """A value JSON has no type for, as JSON lines write it (README "Output files")."""
    if isinstance(v, datetime.timedelta):  # (pandas' Timedelta, duration[ns], is one too)
        return _iso_duration(v)
    if hasattr(v, "isoformat"):
        return v.isoformat()
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, (set, frozenset, tuple)):
        return list(v)
    return str(v)


def _iso_duration(v: datetime.timedelta) -> str:
    """An Arrow duration of any unit as one ISO 8601 duration, exact: ``P1DT0H0M0.000005S``
    (pandas' ``Timedelta.isoformat`` form, which duration[ns] values had, for every unit;
    Python's ``str`` of a timedelta is not ISO 8601), the fraction of a second with its
    trailing zeros dropped. A negative one is the whole duration negated,
    ``-P0DT0H0M0.5S``, as XML Schema's xs:duration signs one (pandas writes
    ``P-1DT23H59M59.5S``: days negative, the rest positive); ``pandas.Timedelta`` reads
    both forms back."""
    value = getattr(v, "value", None)  # pandas' Timedelta: integer nanoseconds
    if value is None:
        value = ((v.days * 86_400 + v.seconds) * 1_000_000 + v.microseconds) * 1_000
    sign = "-" if value < 0 else ""
    days, ns = divmod(abs(value), 86_400 * 10**9)
    hours, ns = divmod(ns, 3_600 * 10**9)
    minutes, ns = divmod(ns, 60 * 10**9)
    seconds, ns = divmod(ns, 10**9)
    fraction = f".{ns:09d}".rstrip("0") if ns else ""
    return f"{sign}P{days}DT{hours}H{minutes}M{seconds}{fraction}S"


_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, default=_json_value)
_NONFINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def file_suffix(path: str) -> str | None:
    """The output-format suffix of a file name (``.csv``, ``.parquet``, ``.jsonl.gz``...),
    or None: a query set, and a Spark run, write a folder, which such a name would
    misdescribe."""
    suffix, gz = _suffix(path)
    if suffix in SUFFIXES or gz:
        return (suffix if suffix in SUFFIXES else "") + (".gz" if gz else "")
    return None
