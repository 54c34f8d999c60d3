"""Input sources, read incrementally.

A source is a Parquet file, a folder of Parquet (or CSV) files, a glob, a CSV file (``.csv``,
``.txt``, optionally gzip-compressed), a pandas DataFrame, a pyarrow Table, RecordBatch or
RecordBatchReader, or a Python iterable (a generator that may never end) of dicts or of
pyarrow RecordBatches. ``open_source`` checks what can be checked before any row is read
(that the file exists, its schema, the timestamp column) and returns a ``Source`` whose
``chunks()`` yields record batches of at most ``chunk_rows`` rows: memory holds one chunk
of a source at a time, never the whole input, and the files of a folder or glob are opened
one at a time, in the order of their paths.

Every chunk is normalized as the engine compares values: timezone-aware timestamps become
naive UTC, dictionary columns are decoded. A source's schema is fixed when it is opened,
before any result: by the files' metadata (Parquet footers; CSV: the first rows of the
first file with rows, whose types every file is read with), or by the first chunk (an
iterable's columns NULL throughout it: by the chunks read ahead to find their types); a
later chunk that does not fit it is an error naming the row (and the file): an iterable's
later chunk is converted only within a family of types, every value exactly (``fit``).
"""

from __future__ import annotations

import bisect
import contextlib
import datetime as dt
import glob as globlib
import itertools
import numbers
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from adaptcq.errors import InputError
from adaptcq.stream.arrays import null_mask
from adaptcq.stream.eventtime import check_time_type

CHUNK_ROWS = 16_384
"""Rows per chunk read from a source (iterables of dicts: ``chunk_rows`` given to the run)."""

READ_AHEAD_ROWS = 100_000
"""An iterable source whose first chunk has a column NULL throughout is read ahead, at the
start, until the column has a value (its type), for at most this many rows (or one chunk)."""

CSV_BLOCK = 1 << 22
"""Bytes of a CSV file parsed at a time (the first block's rows give the column types)."""

CSV_NULLS = {"null_values": [""], "strings_can_be_null": True,
             "quoted_strings_can_be_null": False}
"""How a CSV field is NULL (pyarrow ``ConvertOptions``): only when empty, as Spark and DuckDB
read CSV. pyarrow's default list also takes "NaN", "nan", "NA", "NULL", ... as NULL, so a
NaN written to CSV came back NULL. A quoted empty string ("") stays an empty string, as
adaptcq's CSV output writes one (a NULL is written as an empty field)."""


def _cases(word: str) -> list[str]:
    return ["".join(c) for c in itertools.product(*((x, x.upper()) for x in word))]


CSV_BOOLS = {"true_values": _cases("true"), "false_values": _cases("false")}
"""How a CSV field is a boolean (pyarrow ``ConvertOptions``): ``true`` or ``false`` in any
case, as Spark reads a BooleanType field (Scala's ``toBoolean``); pyarrow's default lists
also take "1" and "0", which Spark reads as malformed (NULL), and not ``tRuE``. A column
with 1/0 is then read as integers, and one with 1 next to true as text, by both runtimes
(Spark is given the types pyarrow infers)."""

def csv_convert_options(column_types: Mapping | None = None):
    """The pyarrow ``ConvertOptions`` of every CSV file adaptcq reads (inputs, a query set's
    control stream): ``CSV_NULLS`` and ``CSV_BOOLS``, and ``column_types`` (name: type)."""
    import pyarrow.csv as pacsv
    return pacsv.ConvertOptions(column_types=column_types, **CSV_NULLS, **CSV_BOOLS)


def csv_parse_options(**options):
    """The pyarrow ``ParseOptions`` of every CSV file adaptcq reads: a quoted field may hold
    line breaks (RFC 4180; adaptcq's CSV output writes such fields). Without
    ``newlines_in_values`` pyarrow cuts a file into blocks at line breaks, and a block
    boundary inside a quoted field made a valid file fail (a wrong "fields" count, or
    pyarrow's "out of sync" error), depending on where its 4 MB blocks fell. Measured at
    no CPU cost on a 3M-row file (pyarrow 26). ``options``: more ``ParseOptions``."""
    import pyarrow.csv as pacsv
    return pacsv.ParseOptions(newlines_in_values=True, **options)


# A bare ".gz" is not CSV: adaptcq's own ".jsonl.gz" output (or any gzip file) in an input
# folder was read as CSV; such files are skipped in a folder, as other files are.
CSV_SUFFIXES = (".csv", ".txt", ".csv.gz", ".txt.gz", ".csv.bz2")
PARQUET_SUFFIXES = (".parquet", ".pq")


@dataclass
class Source:
    """One stream's input: its schema, what it is (for messages), and its chunks."""

    name: str
    schema: pa.Schema                # as in the input (timezones kept: ``_ts`` keeps them)
    what: str                        # e.g. "r.parquet", "a pandas DataFrame"
    _chunks: Iterator[pa.RecordBatch]
    num_rows: int | None = None      # when known up front (Parquet metadata, tables)
    paths: list[Path] = field(default_factory=list)
    rows_read: int = 0
    read_ahead: int | None = None    # iterables: rows read at opening to learn types
    # Files: (the stream's row number of a file's first row, the file), in reading order; a
    # CSV folder's are appended as its files are reached.
    files: list[tuple[int, str]] = field(default_factory=list)
    # Files opened at set-up and not read yet (a CSV file's first block gives its types):
    # closed by ``close`` even when no row was read.
    opened: list = field(default_factory=list)
    # CSV: the file whose first block gave the column types (for messages).
    inferred: Path | None = None

    def close(self) -> None:
        """Close the files the source holds open, now: the one its chunks are being read
        from and one opened at set-up (a chunk generator never started runs no ``finally``
        when closed, so a file opened to learn the types stayed open until a garbage
        collection). The iterables a caller gave are left to the caller."""
        close = getattr(self._chunks, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):  # (a running generator, or its own error)
                close()
        for f in self.opened:
            f.close()
        self.opened.clear()

    def locate(self, row: int) -> tuple[str | None, int]:
        """The file of the stream's row number ``row`` and its row number in that file
        (None and ``row`` for a source that is not files)."""
        k = bisect.bisect_right(self.files, row, key=lambda f: f[0]) - 1
        if k < 0:
            return None, row
        start, path = self.files[k]
        return path, row - start

    def chunks(self) -> Iterator[pa.RecordBatch]:
        """Normalized record batches, in input order; ``rows_read`` counts them."""
        for batch in self._chunks:
            if batch.num_rows == 0:
                continue
            if batch.schema.names != self.schema.names:
                raise InputError(f"stream {self.name}: rows from {self.rows_read} on have "
                                 f"columns {batch.schema.names}, earlier rows "
                                 f"{self.schema.names} ({self.what})")
            if batch.schema != self.schema:
                batch = self._cast(batch)
            self.rows_read += batch.num_rows
            yield normalize(batch)

    def _cast(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        cols = []
        for f, col in zip(self.schema, batch.columns, strict=True):
            if col.type == f.type:
                cols.append(col)
                continue
            if pa.types.is_null(f.type):
                if col.null_count < len(col):
                    row = self.rows_read + int(np.flatnonzero(~null_mask(col))[0])
                    raise InputError(
                        f"stream {self.name}: column {f.name!r} was NULL in all of the first "
                        f"{self.read_ahead or self.rows_read} rows, read before the run "
                        f"started to learn its type (at most {READ_AHEAD_ROWS:,} rows ahead)"
                        f", so its type is null, but row {row} has a value ({self.what}); "
                        "give the column a value in its first rows, or yield RecordBatches "
                        "in which it has a type")
                cols.append(pa.nulls(len(col)))
                continue
            try:
                cols.append(fit(col, f.type))
            except Misfit as e:
                end = self.rows_read + batch.num_rows - 1
                raise InputError(
                    f"stream {self.name}: column {f.name!r} is {f.type} in the first rows and "
                    f"{col.type} in rows {self.rows_read}..{end}{e.at(self.rows_read)}"
                    f" ({self.what}); give the source one type per column") from None
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)


def open_source(name: str, source, timestamp: str, unit: str | None = None,
                chunk_rows: int = CHUNK_ROWS) -> Source:
    """Open one stream's input for incremental reading, checking its timestamp column."""
    src = _open(name, source, chunk_rows)
    try:
        names = src.schema.names
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise InputError(f"stream {name}: {src.what} has more than one column named "
                             f"{dup[0]!r} (its columns: {', '.join(names)})")
        if timestamp not in names:
            raise InputError(f"stream {name}: no timestamp column {timestamp!r} in "
                             f"{src.what} (its columns: {', '.join(names)})")
        try:
            check_time_type(name, timestamp, src.schema.field(timestamp).type, unit)
        except InputError as e:
            odd = _csv_time_misfit(src, timestamp)
            if odd is None:
                raise
            raise InputError(f"{e}: {odd}") from None
    except BaseException:
        src.close()  # (its file: closed now, not when the error is collected)
        raise
    return src


def _csv_time_misfit(src: Source, column: str) -> str | None:
    """Why a CSV source's timestamp ``column`` was inferred as text, naming the row: the
    first value of its first block that the first value's kind (a time with or without a
    zone offset, or a number) does not hold; None if not found (or not such a source)."""
    path = src.inferred
    if path is None or not pa.types.is_string(src.schema.field(column).type):
        return None
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    try:
        with pa.input_stream(str(path), compression="detect") as stream:
            text = next(iter(_columns_reader(stream, [column], pa.string()))).column(0)
        row0 = int(np.flatnonzero(~null_mask(text))[0])
        value0 = text[row0].as_py()
        quoted = '"' + value0.replace('"', '""') + '"\n'
        kind = pacsv.read_csv(pa.py_buffer(("c\n" + quoted).encode()),
                              parse_options=csv_parse_options(),
                              convert_options=csv_convert_options()).schema.field(0).type
    except (pa.ArrowInvalid, OSError, StopIteration, IndexError):
        return None

    def where(row: int) -> str:
        return f"row {row} of {str(path)!r}"
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        # (any unit: pyarrow infers the finest its values need)
        target = pa.timestamp("ns", getattr(kind, "tz", None))
        what = f"a time {'with' if target.tz else 'without'} a zone offset"
    elif pa.types.is_integer(kind) or pa.types.is_floating(kind):
        target, what = pa.float64(), "a number"
    else:
        return (f"{where(row0)} has {value0!r}, which is neither a time nor a number "
                "(CSV types are inferred from the first rows)")
    try:
        pc.utf8_trim_whitespace(text).cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        row = _first_failing(text, lambda a: pc.utf8_trim_whitespace(a).cast(target))
        return (f"{where(row0)} has {value0!r}, {what}, and {where(row)} has "
                f"{text[row].as_py()!r}, which is not (CSV types are inferred from the first "
                "rows); give the column one type in all of its rows")
    return None


def _open(name: str, source, chunk_rows: int) -> Source:
    if isinstance(source, pa.Table):
        return Source(name, source.schema, "a pyarrow Table",
                      iter(source.to_batches(max_chunksize=chunk_rows)), source.num_rows)
    if isinstance(source, pa.RecordBatch):
        return Source(name, source.schema, "a pyarrow RecordBatch",
                      iter([source]), source.num_rows)
    if isinstance(source, pa.RecordBatchReader):
        # A reader is read once: a second run over it saw an empty stream, silently (as an
        # exhausted generator is refused, so is a reader with no batch).
        batches = iter(source)
        first = next(batches, None)
        if first is None:
            raise InputError(f"stream {name}: the RecordBatchReader yielded no batch (a "
                             "reader is read once: was it read already?); give a pyarrow "
                             "Table for an empty stream")
        return Source(name, source.schema, "a pyarrow RecordBatchReader",
                      itertools.chain([first], batches))
    # A DataFrame means pandas is loaded: no need to import it (0.17 s) to test for one.
    pd = sys.modules.get("pandas")
    if pd is not None and isinstance(source, pd.DataFrame):
        return _open_frame(name, source, chunk_rows)
    if isinstance(source, (str, Path)):
        return _open_path(name, source, chunk_rows)
    if isinstance(source, Iterable) and not isinstance(source, (bytes, Mapping)):
        return _open_iterable(name, iter(source), chunk_rows)
    raise InputError(f"stream {name}: cannot read a source of type {type(source).__name__} "
                     "(give a path, a DataFrame, a pyarrow Table or an iterable of dicts)")


def check_tilde_path(path: str, what: str, error=InputError) -> None:
    """Refuse (``error``) a path to read (an input, a query file, a checkpoint) that starts
    with a ``~`` folder that does not exist, as ``runtime.output.check_tilde`` refuses an
    output's: adaptcq takes paths as written, on both runtimes, and a ``~`` left by the
    shell would otherwise be reported only as a missing file."""
    parts = Path(path).parts
    first = parts[0] if parts else ""
    if first.startswith("~") and not os.path.lexists(first):
        raise error(f"{what} {path!r}: there is no folder {first!r} here, and adaptcq does not "
                    "expand '~' (a shell expands it only at the start of a word, not after "
                    "'=' nor inside quotes): give the folder's full path")


def _open_path(name: str, source, chunk_rows: int) -> Source:
    text = str(source)
    check_tilde_path(text, f"stream {name}: input")
    if any(c in text for c in "*?["):
        paths = _glob_files(name, text)
        what = repr(text)
    else:
        path = Path(text)
        if not path.exists():
            raise InputError(f"stream {name}: input file {text!r} does not exist")
        if path.is_dir():
            paths = sorted(_folder_files(name, path))
            if not paths:
                raise InputError(f"stream {name}: folder {text!r} holds no Parquet or CSV "
                                 "files")
        else:
            paths = [path]
        what = repr(text)
    kinds = {_kind(p) for p in paths}
    if None in kinds:
        bad = next(p for p in paths if _kind(p) is None)
        raise InputError(f"stream {name}: {str(bad)!r} is neither Parquet nor CSV: an "
                         f"input file's name ends in {_suffixes(PARQUET_SUFFIXES)} (Parquet)"
                         f" or {_suffixes(CSV_SUFFIXES)} (CSV), in any case")
    if len(kinds) > 1:
        raise InputError(f"stream {name}: {what} mixes Parquet and CSV files")
    kind = kinds.pop()
    # Files are opened one at a time, in order, when their rows are read: a folder of many
    # files holds one file's reader (and buffer) at a time, and one file descriptor. What
    # is checked before any row is read comes from Parquet footers and CSV headers, each
    # file closed again at once.
    if kind == "parquet":
        metas = [_parquet_meta(name, p) for p in paths]
        schema = metas[0][0]
        if any(not s.equals(schema) for s, _ in metas[1:]):
            # Nullability and field metadata are no difference (Spark writes its fields
            # non-nullable, pandas nullable): the files' schema is then every field
            # nullable, which each file's batches fit (``Source._cast``).
            schema = _nullable_schema(schema)
            for (s, _), p in zip(metas[1:], paths[1:]):
                if not _nullable_schema(s).equals(schema):
                    raise InputError(f"stream {name}: {str(p)!r} has columns "
                                     f"{_describe(s)}, but {str(paths[0])!r} has "
                                     f"{_describe(metas[0][0])} ({_schema_difference(s, schema)})"
                                     f"; every file of {what} needs the same columns")
        starts = np.cumsum([0] + [n for _, n in metas[:-1]]).tolist()
        files = [(int(a), str(p)) for a, p in zip(starts, paths, strict=True)]
        total = sum(n for _, n in metas)
        chunks = _parquet_chunks(name, paths, chunk_rows)
    else:
        # Empty files among several (a header and no rows, or nothing: Spark writes them for
        # empty partitions) are skipped; the first file with rows gives the types.
        many = len(paths) > 1
        for k, p in enumerate(paths):
            got = _csv(name, p, skip_empty=many)
            if got is not None:
                break
        else:
            raise InputError(f"stream {name}: every file of {what} is empty (a header and no "
                             "rows, or nothing); the types of a CSV file's columns are read "
                             "from its rows")
        schema, first = got
        read = [p]  # the files to read: this one, then the later ones with a header
        try:
            for j, q in enumerate(paths):
                names = None if j == k else _csv_header(name, q, skip_empty=True)
                if names is None:
                    continue
                if names != schema.names:
                    raise InputError(f"stream {name}: {str(q)!r} has columns "
                                     f"{', '.join(names)}, but {str(p)!r} has "
                                     f"{', '.join(schema.names)}; every file of {what} "
                                     "needs the same columns")
                if j > k:
                    read.append(q)
        except BaseException:
            first[0].close()
            raise
        total = None
        files = []
        chunks = _csv_chunks(name, read, chunk_rows, first, schema, files)
        return Source(name, schema, what if len(paths) > 1 else repr(str(paths[0])),
                      chunks, total, paths, files=files, opened=[first[0]], inferred=p)
    return Source(name, schema, what if len(paths) > 1 else repr(str(paths[0])), chunks,
                  total, paths, files=files)


def _suffixes(suffixes: tuple[str, ...]) -> str:
    return ", ".join(suffixes[:-1]) + " or " + suffixes[-1]


def _kind(path: Path) -> str | None:
    low = path.name.lower()
    if low.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if low.endswith(CSV_SUFFIXES):
        return "csv"
    return None


def hidden_name(name: str) -> bool:
    """Whether a file or folder of this name, inside a folder or matched by a glob, is
    skipped: a name starting with ``.``, or with ``_`` and holding no ``=``. This is Spark's
    file source rule (``HadoopFSUtils.shouldFilterOutPathName``, ``isDataPath``: ``_day=1``
    is a partition folder), kept here so that both runtimes read the same files."""
    return name.startswith(".") or (name.startswith("_") and "=" not in name)


def _folder_files(name: str, root: Path) -> list[Path]:
    """The Parquet and CSV files of folder ``root`` and its subfolders, unsorted, named
    through ``root`` as given, as Spark's file source lists them (``recursiveFileLookup``):
    ``hidden_name`` entries skipped at every level, links to folders followed (``rglob``
    does not follow them, Spark does). A link to a folder that holds it is refused, naming
    it: Spark follows it until the system's link limit, reading the files again at each
    level."""
    out: list[Path] = []
    stack = [(root, (root.resolve(),))]  # (folder, real paths of it and its parents)
    while stack:
        folder, chain = stack.pop()
        try:
            entries = list(folder.iterdir())
        except OSError as e:
            raise InputError(f"stream {name}: cannot list folder {str(folder)!r}: "
                             f"{e.strerror or e}") from None
        for p in entries:
            if hidden_name(p.name):
                continue
            if p.is_dir():  # (follows a link)
                real = p.resolve()
                # a folder of the walk's path again, or one above it (a link to "../..")
                if real in chain or chain[-1].is_relative_to(real):
                    raise InputError(
                        f"stream {name}: {str(p)!r} is a link to {str(real)!r}, a folder "
                        f"that holds it, so the files of {str(real)!r} would be read over "
                        "and over (Spark's file source reads them again at every level); "
                        "remove the link")
                stack.append((p, (*chain, real)))
            elif p.is_file():
                if _kind(p) is not None:
                    out.append(p)
            elif p.is_symlink():
                _dangling(name, p)
    return out


def _dangling(name: str, link: Path) -> None:
    """Refuse a link whose target does not exist, in a folder or matched by a glob (it was
    skipped silently, where a broken link given as the input is refused): whether it stood
    for a file or a folder of the input cannot be told."""
    raise InputError(f"stream {name}: {str(link)!r} is a link to {os.readlink(link)!r}, which "
                     "does not exist; restore its target or remove the link")


def _glob_files(name: str, text: str) -> list[Path]:
    """The files a glob names, in path order: each matching file (but not one of a
    ``hidden_name``), and the files of each matching folder, as a folder input's
    (``_folder_files``). Spark reads a glob so (its matches are the paths it lists, with
    ``recursiveFileLookup``); a ``*`` matches names starting with ``.`` there too (Hadoop's
    glob), so here too, but for ``**``, which Spark refuses (Python's rule then)."""
    check_glob(name, text)
    files: set[Path] = set()
    matches = globlib.glob(text, recursive=True, include_hidden="**" not in text)
    for m in matches:
        p = Path(m)
        if p.is_dir():
            files.update(_folder_files(name, p))
        elif hidden_name(p.name):
            continue
        elif p.is_file():
            files.add(p)
        elif p.is_symlink():
            _dangling(name, p)
    if not files:
        if not matches:
            raise InputError(f"stream {name}: no file matches {text!r}")
        raise InputError(f"stream {name}: {text!r} matches {len(matches)} path(s) but no "
                         "file to read: a matching folder holds no Parquet or CSV file, and "
                         "a matching file whose name starts with '_' or '.' is skipped (as "
                         "Spark's file source skips it)")
    # The order of Path objects (component by component) is the order Spark's split gives a
    # source's files (runtime.spark_split._file_key).
    return sorted(files)


def _glob_refusal(text: str) -> tuple[int, str] | None:
    """(position, why) of the first part of glob ``text`` that Python's glob (the local
    runtime's) and Hadoop's (Spark's file source) read differently; None if none. Only the
    path's components holding ``*``, ``?`` or ``[`` are patterns to Python: the others are
    taken literally by both (runtime.spark escapes them for Hadoop)."""
    at, wild = 0, False
    parts = text.split("/")
    for n, part in enumerate(parts):
        if wild and part == "..":
            # (Spark is handed the normalized path: "*/../x" is "x" there, once per folder
            # here)
            return at, ("'..' after a wildcard part names each match's parent again "
                        "to the local runtime's glob (Python's) but is folded away in the "
                        "path Spark's file source is given")
        if wild and part == "" and n == len(parts) - 1:
            return at - 1, ("a '/' at the end matches only folders to the local runtime's "
                            "glob (Python's) but is dropped from the path Spark's file "
                            "source is given, which then matches files too")
        wild = wild or globlib.has_magic(part)
        if globlib.has_magic(part):
            for k, c in enumerate(part):
                if c in "{}":
                    return at + k, (f"{c!r} is part of an alternation ({{a,b}}) to Spark's file "
                                    "source (Hadoop's glob) but a plain character to the local "
                                    "runtime's (Python's glob)")
                if c == "\\":
                    return at + k, ("'\\' escapes the next character to Spark's file source "
                                    "(Hadoop's glob) but is a plain character to the local "
                                    "runtime's (Python's glob)")
            k = part.find("[")
            while k >= 0:
                j = k + 1 + (part[k + 1:k + 2] == "!")
                if part[j:j + 1] == "^":
                    return at + k, ("'[^' negates a class to Spark's file source (Hadoop's glob) "
                                    "but matches '^' to the local runtime's (Python's glob); "
                                    "write '[!...]', a negation to both")
                close = part.find("]", j + 1)  # (a ']' first in a class is a member, in both)
                if close < 0:
                    return at + k, ("a '[' with no closing ']' is a plain character to the local "
                                    "runtime's glob (Python's) and an error to Spark's "
                                    "(Hadoop's)")
                inner = part[j:close]
                odd = next((c for c in inner if c in "[*?"), None)
                if odd is not None:
                    return at + k, (f"{odd!r} inside a class '[...]' is a plain character to "
                                    "the local runtime's glob (Python's) but not to Spark's "
                                    "(Hadoop's)")
                k = part.find("[", close + 1)
        at += len(part) + 1
    return None


def check_glob(name: str, text: str) -> None:
    """Refuse a glob input whose syntax means different files to the two runtimes
    (``_glob_refusal``), naming the stream, the glob and the character: the same glob must
    read the same files on both (docs/spark.md, "Inputs")."""
    found = _glob_refusal(text)
    if found is not None:
        k, why = found
        raise InputError(f"stream {name}: glob {text!r}, character {k + 1} ({text[k]!r}): "
                         f"{why}, so the two runtimes would read different files; rewrite the "
                         "glob without it, or give a folder")


def _describe(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema)


def _nullable_type(t: pa.DataType) -> pa.DataType:
    """``t`` with every nested field nullable and without metadata (a map's keys stay
    non-nullable, as Arrow requires)."""
    def loose(f: pa.Field) -> pa.Field:
        return pa.field(f.name, _nullable_type(f.type))
    if pa.types.is_struct(t):
        return pa.struct([loose(t.field(k)) for k in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(_nullable_type(t.key_type), loose(t.item_field), t.keys_sorted)
    if pa.types.is_large_list(t):
        return pa.large_list(loose(t.value_field))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(loose(t.value_field), t.list_size)
    if pa.types.is_list(t):
        return pa.list_(loose(t.value_field))
    return t


def _nullable_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every field (nested ones too) nullable and no metadata: what two
    Parquet files of one input must share."""
    return pa.schema([pa.field(f.name, _nullable_type(f.type)) for f in schema])


def _schema_difference(schema: pa.Schema, first: pa.Schema) -> str:
    """The first column where Parquet ``schema`` differs from the ``first`` file's, both
    ``_nullable_schema``s (a message's pointer: nullability is no difference)."""
    for k, (f, g) in enumerate(itertools.zip_longest(schema, first)):
        if f is None:
            return f"it lacks column {g.name!r}"
        if g is None:
            return f"it has a column {f.name!r} more"
        if f.name != g.name:
            return f"its column {k + 1} is {f.name!r}, not {g.name!r}"
        if not f.type.equals(g.type):
            return f"its column {f.name!r} is {f.type}, not {g.type}"
    return "its columns differ"


def _parquet_meta(name: str, path: Path) -> tuple[pa.Schema, int]:
    """A Parquet file's schema and row count, from its footer (the file is closed again)."""
    import pyarrow.parquet as pq
    try:
        with pq.ParquetFile(path) as f:
            return f.schema_arrow.remove_metadata(), f.metadata.num_rows
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"stream {name}: cannot read {str(path)!r}: {e}") from None


def _parquet_chunks(name: str, paths: list[Path], chunk_rows: int):
    """The row groups of ``paths``, a file at a time (each closed when read)."""
    import pyarrow.parquet as pq
    for path in paths:
        try:
            f = pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError(f"stream {name}: cannot read {str(path)!r}: {e}") from None
        with f:
            yield from _guard(name, path, f.iter_batches(batch_size=chunk_rows))


class _EmptyFile(InputError):
    """A CSV file with no header (nothing at all)."""


def _csv(name: str, path: Path, skip_empty: bool = False):
    """The first CSV file of a source: its schema (types inferred from its first block)
    and its open stream and reader; None for an empty file (no rows) if ``skip_empty``."""
    try:
        stream, reader = _csv_open(name, path)
    except _EmptyFile:
        if skip_empty:
            return None
        raise
    schema = reader.schema
    if any(pa.types.is_null(f.type) for f in schema):
        first = next(iter(_guard(name, path, reader)), None)
        stream.close()
        if first is None:
            if skip_empty:
                return None
            raise InputError(f"stream {name}: {str(path)!r} has a header but no rows; the "
                             "types of a CSV file's columns are read from its rows")
        # A column empty in all of the first block is text, as Spark and DuckDB read a CSV
        # column with no value (it was refused, even when the query never reads it).
        schema = _first_block_types(name, path, pa.schema(
            [f.with_type(pa.string()) if pa.types.is_null(f.type) else f for f in schema]))
        return schema, _csv_open(name, path, schema)
    fixed = _first_block_types(name, path, schema)
    if fixed is not schema:
        stream.close()
        return fixed, _csv_open(name, path, fixed)
    return schema, (stream, reader)


WHOLE_TYPE = pa.decimal128(38, 0)
"""The type of a CSV column of whole numbers not all within int64 (Spark: DecimalType(38, 0))."""

_WHOLE = r"^\s*[+-]?\d+\s*$"
_WIDE = r"^\s*[+-]?0*[1-9]\d{38,}\s*$"  # more than 38 digits
# 16 digits or more: a double may round it (every whole number of up to 15 digits is exact)
_INEXACT = r"^\s*[+-]?0*[1-9]\d{15,}\s*$"


def _first_block_types(name: str, path: Path, schema: pa.Schema) -> pa.Schema:
    """``schema``, inferred by pyarrow from the first block of CSV file ``path``, with what
    pyarrow's inference gets wrong put right, from the block's text (read again, only when
    there is a float64 or binary column). A float64 column whose values are all whole
    numbers (sign, digits), one of 16 digits or more, holds one beyond int64 (pyarrow falls
    back to double, so distinct ids joined as equal): it is ``WHOLE_TYPE``, exact, or, with
    a value of more than 38 digits, refused. (Whole numbers of up to 15 digits are float64
    only when written with a '+', which pyarrow's int64 refuses: a double holds them
    exactly, and they stay float64.) A binary column holds text that is not UTF-8: refused (Spark reads the
    file as UTF-8, replacing such bytes). Both name the file, row and column."""
    import pyarrow.compute as pc
    floats = [f.name for f in schema if pa.types.is_float64(f.type)]
    if floats:
        # The first 64 KB first (most float columns show a fraction there): the whole block
        # is read again only for the columns still all whole numbers (the block took about
        # 85 ms of CPU for three float columns, 4 MB).
        with contextlib.suppress(pa.ArrowInvalid, OSError, StopIteration):  # (then: all)
            head = _block_text(path, floats, 1 << 16)
            floats = [c for c in floats if pc.all(pc.match_substring_regex(
                head.column(c).cast(pa.string()), _WHOLE)).as_py() is not False]
    look = floats + [f.name for f in schema if pa.types.is_binary(f.type)]
    if not look:
        return schema
    try:
        batch = _block_text(path, look, CSV_BLOCK)
    except (pa.ArrowInvalid, OSError, StopIteration) as e:
        raise InputError(f"stream {name}: cannot read {str(path)!r}: {e}") from None
    for k, f in enumerate(schema):
        if f.name not in look:
            continue
        raw = batch.column(f.name)
        if pa.types.is_binary(f.type):
            row = _first_failing(raw, lambda a: a.cast(pa.string()))
            raise InputError(
                f"stream {name}: row {row} of {str(path)!r} has {raw[row].as_py()!r} in "
                f"column {f.name!r}, which is not UTF-8 text; a CSV file is read as UTF-8 (by "
                "Spark too, which would replace such bytes): convert the file to UTF-8 (e.g. "
                "iconv -f latin1 -t utf-8), or use Parquet")
        text = raw.cast(pa.string())
        if not pc.all(pc.match_substring_regex(text, _WHOLE)).as_py() \
                or not pc.any(pc.match_substring_regex(text, _INEXACT)).as_py():
            continue
        row = pc.index(pc.match_substring_regex(text, _WIDE), True).as_py()
        if row >= 0:
            raise InputError(
                f"stream {name}: row {row} of {str(path)!r} has {text[row].as_py()!r} in "
                f"column {f.name!r}, a whole number of more than 38 digits: a CSV column of "
                f"whole numbers is read as int64, or as {WHOLE_TYPE} when one is beyond int64,"
                " and neither holds it; use Parquet (a string or decimal256 column)")
        schema = schema.set(k, f.with_type(WHOLE_TYPE))
    return schema


def _block_text(path: Path, columns: list[str], block: int) -> pa.RecordBatch:
    """The first block (of ``block`` bytes) of CSV file ``path``: its ``columns``, as bytes."""
    with pa.input_stream(str(path), compression="detect") as stream:
        return next(iter(_columns_reader(stream, columns, pa.binary(), block)))


def _columns_reader(stream, columns: list[str], type_: pa.DataType, block: int = CSV_BLOCK):
    """A CSV reader on ``stream`` of ``columns`` alone, all read as ``type_`` (text or
    bytes: no value can fail to convert), parsed as the inputs are (nulls, line breaks)."""
    import pyarrow.csv as pacsv
    return pacsv.open_csv(
        stream, read_options=pacsv.ReadOptions(block_size=block),
        parse_options=csv_parse_options(),
        convert_options=pacsv.ConvertOptions(
            include_columns=columns, column_types=dict.fromkeys(columns, type_),
            **CSV_NULLS, **CSV_BOOLS))


def _first_failing(values: pa.Array, convert) -> int:
    """The first position of ``values`` whose value ``convert`` (on an array) refuses, given
    that it refuses ``values``: found by halving (a few conversions, no Python loop)."""
    lo, hi = 0, len(values)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            convert(values.slice(lo, mid - lo))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            hi = mid
        else:
            lo = mid
    return lo


def _csv_open(name: str, path: Path, schema: pa.Schema | None = None,
              where: tuple = (None, 0, 1)):
    """An input stream on a CSV file (decompressed by its suffix) and a reader on it, with
    the column types of ``schema`` (None: inferred from the file's first block); ``where``:
    the source's first file, rows before this file, files (for ``_csv_error``)."""
    import pyarrow.csv as pacsv
    convert = csv_convert_options(None if schema is None else {f.name: f.type for f in schema})
    stream = None
    try:
        stream = pa.input_stream(str(path), compression="detect")
        return stream, pacsv.open_csv(stream, convert_options=convert,
                                      read_options=pacsv.ReadOptions(block_size=CSV_BLOCK),
                                      parse_options=csv_parse_options())
    except (pa.ArrowInvalid, OSError) as e:
        if stream is not None:
            stream.close()
        if "Empty CSV file" in str(e):
            if _first_line_exceeds_block(path):  # (pyarrow says "empty" for it)
                raise InputError(
                    f"stream {name}: cannot read {str(path)!r}: its first line, the header, "
                    f"is longer than {CSV_BLOCK:,} bytes, the block a CSV file is read by"
                ) from None
            raise _EmptyFile(f"stream {name}: {str(path)!r} is empty (no header, no rows)") \
                from None
        raise _csv_error(name, path, e, schema, *where) from None


def _first_line_exceeds_block(path: Path) -> bool:
    """Whether a CSV file's first ``CSV_BLOCK`` bytes (decompressed) hold no line end."""
    with pa.input_stream(str(path), compression="detect") as f:
        head = f.read(CSV_BLOCK + 1)
    first = head[:CSV_BLOCK]
    return len(head) > CSV_BLOCK and b"\n" not in first and b"\r" not in first


def _csv_header(name: str, path: Path, skip_empty: bool = False) -> list[str] | None:
    """A CSV file's column names, from its header line alone (the file is closed again);
    None for an empty file (no header) if ``skip_empty``."""
    import pyarrow.csv as pacsv
    try:
        with pa.input_stream(str(path), compression="detect") as f:
            head = b""
            while b"\n" not in head:
                piece = f.read(1 << 16)
                if not piece:
                    break
                head += piece
        line = head[:head.index(b"\n") + 1] if b"\n" in head else head
        if line.count(b'"') % 2 == 0:  # else a quoted name holds a line break
            return pacsv.read_csv(pa.py_buffer(line),
                                  parse_options=csv_parse_options()).column_names
    except (pa.ArrowInvalid, OSError) as e:
        if "Empty CSV file" in str(e):
            if skip_empty:
                return None
            raise _EmptyFile(f"stream {name}: {str(path)!r} is empty (no header, no rows)") \
                from None
        raise InputError(f"stream {name}: cannot read {str(path)!r}: {e}") from None
    stream, reader = _csv_open(name, path)
    with stream:
        return reader.schema.names


def _csv_chunks(name: str, paths: list[Path], chunk_rows: int, first, schema: pa.Schema,
                files: list[tuple[int, str]]):
    """The rows of ``paths``, a file at a time (each closed when read); ``first``: the
    first file's open stream and reader, whose types (``schema``) every later file is read
    with, as if the files were one: a value that does not fit is an error naming its file,
    row and column. Each file's first row number goes to ``files`` as it is reached."""
    start = 0  # rows of the stream before this file
    for k, path in enumerate(paths):
        stream, reader = first if k == 0 else _csv_open(name, path, schema,
                                                        (paths[0], start, len(paths)))
        files.append((start, str(path)))
        with stream:
            in_file = 0
            for batch in _guard(name, path, reader, lambda e, p=path, s=start: _csv_error(
                    name, p, e, schema, paths[0], s, len(paths))):
                in_file += batch.num_rows
                yield from _rechunk([batch], chunk_rows)
        start += in_file


def csv_file_error(name: str, path, schema: pa.Schema, first=None) -> InputError | None:
    """The error the local runtime stops with in CSV file ``path`` of stream ``name``, read
    with the source's column types ``schema`` (inferred from ``first``, the source's first
    file), as ``_csv_chunks`` reads a file after the first, its row numbered within the
    file; None if every row reads. The Spark runtime asks for it when Spark's CSV reader
    (FAILFAST) stops at a file, so that both runtimes name the same row."""
    path = Path(path)
    try:
        stream, reader = _csv_open(name, path, schema, (first, 0, 1))
        with stream:
            for _ in _guard(name, path, reader, lambda e: _csv_error(
                    name, path, e, schema, first, 0, 1)):
                pass
    except _EmptyFile:
        return None
    except InputError as e:
        return e
    return None


_CONVERSION = re.compile(r"In CSV column #(\d+): ")
# pyarrow's conversion errors that quote the value (its text is then found by _find_text):
# a value its column's type cannot hold, a time with a zone offset in a column without one
# or the other way round, and a decimal's digits beyond its precision or not a number.
_QUOTED_VALUE = re.compile(
    r"CSV conversion error to .*?: (?:invalid value '(?P<a>.*)'"
    r"|expected (?P<zone>a|no) zone offset in '(?P<b>.*?)'(?:\. If these timestamps |\Z))"
    r"|Error converting '(?P<c>.*)' to [^']*: precision not supported"
    r"|The string '(?P<d>.*)' is not a valid \w+ number", re.DOTALL)
# ... and those that quote none (the row is found by converting the column again,
# _find_misfit): text that is not UTF-8, a decimal's fraction beyond its scale.
# (pyarrow before 21 says "Rescaling Decimal128 value")
_UNQUOTED_VALUE = re.compile(r"CSV conversion error to string: invalid UTF8 data"
                             r"|Rescaling Decimal(?:128|256)? value would cause data loss")


def _csv_error(name: str, path: Path, e: Exception, schema: pa.Schema | None,
               first: Path | None, start: int, files: int) -> InputError:
    """The error of a CSV reader. A value that does not fit its column's type (inferred
    from the first rows of the source's first file) names the file, the row and the
    column; ``start``: rows of the stream before this file. A row with too few or too many
    fields names the file and the row (pyarrow's message quotes the row, not its number).
    Rows are records, counted from 0 after the header (a quoted field may span lines)."""
    ragged = _RAGGED.search(str(e))
    found = _ragged_row(path) if ragged is not None else None
    if found is not None:
        row, expected, actual, text = found
        where = (f"row {start + row} (row {row} of {str(path)!r})" if files > 1
                 else f"row {row} of {str(path)!r}")
        return InputError(f"stream {name}: {where} has {actual} field(s), but the header has "
                          f"{expected} columns: {_brief(text)}; give every row one field per "
                          "column (quote a field that holds the delimiter)")
    m = _CONVERSION.search(str(e))
    generic = InputError(f"stream {name}: cannot read {str(path)!r}: {e}")
    if m is None or schema is None or int(m[1]) >= len(schema):
        return generic
    col, rest = schema.field(int(m[1])), str(e)[m.end():]
    quoted = _QUOTED_VALUE.match(rest)
    if quoted is not None:
        value = next(v for v in quoted.group("a", "b", "c", "d") if v is not None)
        row = _find_text(path, col.name, value)
    elif _UNQUOTED_VALUE.match(rest):
        found = _find_misfit(path, col)
        if found is None:
            return generic
        row, value = found
    else:
        return generic
    if row is None:
        where = f"a row of {str(path)!r}"
    elif files > 1:
        where = f"row {start + row} (row {row} of {str(path)!r})"
    else:
        where = f"row {row} of {str(path)!r}"
    if isinstance(value, bytes):
        return InputError(f"stream {name}: {where} has {value!r} in column {col.name!r}, which "
                          "is not UTF-8 text; a CSV file is read as UTF-8: convert the file to "
                          "UTF-8 (e.g. iconv -f latin1 -t utf-8), or use Parquet")
    origin = ("its first rows" if first is None or first == path
              else f"the first rows, in {str(first)!r}")
    hint = "give the column one type in all of its rows"
    if pa.types.is_integer(col.type) and re.fullmatch(_WHOLE, value):
        # (not "write 1.0": a float column would round such ids and join distinct ones)
        hint = ("a whole number beyond int64: put a row holding one in the first rows of "
                f"the first file (the column is then {WHOLE_TYPE})")
    elif pa.types.is_integer(col.type) and _is_float(value):
        hint += (" (if it holds fractions, write its whole numbers as 1.0, not 1, in the "
                 "first rows)")
    elif col.type == WHOLE_TYPE:
        hint += (f" (a CSV column of whole numbers, one beyond int64, is read as {col.type},"
                 " which holds no fraction and at most 38 digits)")
    elif quoted is not None and quoted["zone"] is not None:
        hint += (" (every time with a zone offset, such as Z or +01:00, or every time "
                 "without one)")
    return InputError(f"stream {name}: {where} has {value!r} in column {col.name!r}, which is "
                      f"{col.type}, the type of {origin}; {hint}, or use Parquet (CSV types "
                      "are inferred from the first rows of the first file)")


def _find_misfit(path: Path, column: pa.Field) -> tuple[int, str | bytes] | None:
    """The first row of a CSV file whose ``column`` text its type does not hold, and that
    text (bytes if it is not UTF-8), for a pyarrow error that quotes no value; None: not
    found, or the file cannot be read again. Each block is converted again, and halved
    down to the value (``_first_failing``) in the one that fails."""
    import pyarrow.compute as pc

    def convert(raw: pa.Array):
        text = raw.cast(pa.string())
        if pa.types.is_string(column.type):
            return text
        # (pyarrow's CSV reader takes a number between spaces, its cast does not)
        return pc.utf8_trim_whitespace(text).cast(column.type)
    try:
        with pa.input_stream(str(path), compression="detect") as stream:
            reader = _columns_reader(stream, [column.name], pa.binary())
            seen = 0
            for batch in reader:
                raw = batch.column(0)
                try:
                    convert(raw)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    k = _first_failing(raw, convert)
                    value = raw[k].as_py()
                    with contextlib.suppress(UnicodeDecodeError):
                        value = value.decode()
                    return seen + k, value
                seen += batch.num_rows
    except (pa.ArrowInvalid, OSError):
        return None
    return None


_RAGGED = re.compile(r"Expected \d+ columns, got \d+")


def _ragged_row(path: Path) -> tuple[int, int, int, str] | None:
    """The first row of a CSV file whose fields are not one per column: (its row number
    after the header, the columns, its fields, its text); None: none found, or the file
    cannot be read again. Read serially (pyarrow numbers rows only then, blank lines not
    counted, as the rows are; the header is row 1 here), its first column alone kept, as
    text (no value can fail to convert first)."""
    import pyarrow.csv as pacsv
    bad: list = []

    def handler(row):
        bad.append(row)
        return "error"  # (stops the read here)
    try:
        with pa.input_stream(str(path), compression="detect") as stream:
            reader = pacsv.open_csv(
                stream, read_options=pacsv.ReadOptions(block_size=CSV_BLOCK, use_threads=False,
                                                       autogenerate_column_names=True),
                parse_options=csv_parse_options(invalid_row_handler=handler),
                convert_options=pacsv.ConvertOptions(include_columns=["f0"],
                                                     column_types={"f0": pa.string()}))
            for _ in reader:
                pass
    except (pa.ArrowInvalid, OSError):
        pass
    if not bad or bad[0].number is None:
        return None
    row = bad[0]
    return row.number - 2, row.expected_columns, row.actual_columns, row.text


def _find_text(path: Path, column: str, value: str) -> int | None:
    """The first row of a CSV file whose ``column`` holds the text ``value`` (None: not
    found, or the file cannot be read again)."""
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    try:
        with pa.input_stream(str(path), compression="detect") as stream:
            reader = pacsv.open_csv(stream, read_options=pacsv.ReadOptions(block_size=CSV_BLOCK),
                                    parse_options=csv_parse_options(),
                                    convert_options=pacsv.ConvertOptions(
                                        include_columns=[column],
                                        column_types={column: pa.string()}))
            seen = 0
            for batch in reader:
                k = pc.index(batch.column(0), value).as_py()
                if k >= 0:
                    return seen + k
                seen += batch.num_rows
    except (pa.ArrowInvalid, OSError):
        return None
    return None


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _guard(name: str, path: Path, batches: Iterable[pa.RecordBatch], error=None):
    """Read errors in the middle of a file name the stream and the file (``error``: the
    InputError to raise for one, e.g. ``_csv_error``'s, which also names the row)."""
    it = iter(batches)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except (pa.ArrowInvalid, OSError) as e:
            if error is not None:
                raise error(e) from None
            raise InputError(f"stream {name}: cannot read {str(path)!r}: {e}") from None
        yield batch


def _rechunk(batches: Iterable[pa.RecordBatch], chunk_rows: int):
    for b in batches:
        for k in range(0, b.num_rows, chunk_rows):
            yield b.slice(k, chunk_rows)


def _open_frame(name: str, frame, chunk_rows: int) -> Source:
    """A pandas DataFrame, converted ``chunk_rows`` at a time. Column names must be
    distinct strings (pyarrow's own errors named neither the stream nor the fix, and came
    at the first chunk), and every column one Arrow type."""
    labels = list(frame.columns)
    odd = [c for c in labels if not isinstance(c, str)]
    if odd:
        raise InputError(f"stream {name}: a pandas DataFrame's column names must be strings, "
                         f"not {odd[0]!r} ({type(odd[0]).__name__}); rename it, e.g. "
                         "frame.columns = frame.columns.map(str)")
    dup = sorted({c for c in labels if labels.count(c) > 1})
    if dup:
        raise InputError(f"stream {name}: a pandas DataFrame has more than one column "
                         f"named {dup[0]!r}")
    try:
        schema = pa.Schema.from_pandas(frame, preserve_index=False).remove_metadata()
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
        bad = next((c for c in labels if not _converts(frame[c])), None)
        where = f"column {bad!r}" if bad is not None else "a column"
        raise InputError(f"stream {name}: the pandas DataFrame's {where} cannot be one "
                         f"Arrow type (mixed values?): {e}") from None

    def chunks():
        for k in range(0, len(frame), chunk_rows):
            try:
                yield pa.RecordBatch.from_pandas(frame.iloc[k:k + chunk_rows], schema=schema,
                                                 preserve_index=False)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                raise InputError(f"stream {name}: rows {k}..{min(len(frame), k + chunk_rows) - 1}"
                                 f" of the pandas DataFrame do not fit the types of its "
                                 f"first rows ({_describe(schema)}): {e}") from None
    return Source(name, schema, "a pandas DataFrame", chunks(), len(frame))


def _converts(series) -> bool:
    try:
        pa.Array.from_pandas(series)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        return False
    return True


def _open_iterable(name: str, it: Iterator, chunk_rows: int) -> Source:
    """A Python iterable of dicts (or of RecordBatches), read ``chunk_rows`` at a time.
    The schema is inferred from the first chunk; columns that are null throughout it take
    their type from the first later chunk that has values, read ahead here (``_read_ahead``)
    so that the schema, and the run's output types, are fixed before the run starts."""
    first = next(it, None)
    if first is None:
        raise InputError(f"stream {name}: the iterable source yielded no rows, so its "
                         "columns are unknown; give a pyarrow Table or RecordBatch for an "
                         "empty stream")
    if isinstance(first, pa.RecordBatch):
        rest = _batches_only(name, it)
        box = [first.schema]
        ahead = _read_ahead(box, first.num_rows, rest, chunk_rows)
        return Source(name, box[0], "an iterable of RecordBatches",
                      itertools.chain([first], ahead, rest),
                      read_ahead=first.num_rows + sum(b.num_rows for b in ahead))
    rows = [first, *itertools.islice(it, chunk_rows - 1)]
    batch = _from_dicts(name, rows, None, 0)
    box = [batch.schema]  # the schema later chunks are converted to (learnt while reading ahead)
    rest = _dict_chunks(name, box, it, chunk_rows, batch.num_rows)
    ahead = _read_ahead(box, batch.num_rows, rest, chunk_rows)
    return Source(name, box[0], "an iterable of dicts", itertools.chain([batch], ahead, rest),
                  read_ahead=batch.num_rows + sum(b.num_rows for b in ahead))


def _read_ahead(box: list, rows: int, rest: Iterator[pa.RecordBatch],
                chunk_rows: int) -> list[pa.RecordBatch]:
    """While a column of ``box[0]`` is of type null (NULL throughout the chunks so far),
    read chunks of ``rest`` ahead and take the column's type from the first that has one:
    until every column has a type, the input ends, or ``READ_AHEAD_ROWS`` rows (at least
    one chunk) were read ahead. ``box[0]`` becomes the learnt schema; returns the chunks
    read (a column still null then stays null: all its values are NULL)."""
    ahead: list[pa.RecordBatch] = []
    limit = rows + max(READ_AHEAD_ROWS, chunk_rows)
    while any(pa.types.is_null(f.type) for f in box[0]) and rows < limit:
        batch = next(rest, None)
        if batch is None:
            break
        ahead.append(batch)
        rows += batch.num_rows
        if batch.schema.names != box[0].names:
            break  # Source.chunks says so, naming the rows
        box[0] = pa.schema([g if pa.types.is_null(f.type) else f
                            for f, g in zip(box[0], batch.schema, strict=True)])
    return ahead


def _batches_only(name: str, it: Iterator):
    for k, b in enumerate(it, 1):
        if not isinstance(b, pa.RecordBatch):
            raise InputError(f"stream {name}: item {k} of the iterable source is "
                             f"{type(b).__name__}; it started with RecordBatches")
        yield b


def _dict_chunks(name: str, box: list, it: Iterator, chunk_rows: int, start: int):
    """The chunks of dicts after the first, each converted to the schema in ``box``."""
    while True:
        rows = list(itertools.islice(it, chunk_rows))
        if not rows:
            return
        batch = _from_dicts(name, rows, box[0], start)
        start += len(rows)
        yield batch


def _from_dicts(name: str, rows: list, schema: pa.Schema | None, start: int) -> pa.RecordBatch:
    """A chunk of dicts as a batch of ``schema`` (None: the types its values give). The
    values' own types are inferred, then fitted to ``schema`` (``fit``): given the schema,
    pyarrow cut a later 1.5 to 1 in an int64 column, and a datetime to its date. Inferring
    one type for the chunk converts a few kinds into others silently (a datetime after a
    date to a date): those are refused, in any chunk (``_check_mixed``)."""
    for k, r in enumerate(rows):
        if not isinstance(r, Mapping):
            raise InputError(f"stream {name}: row {start + k} is {type(r).__name__}; an "
                             "iterable source yields dicts of column -> value")
    columns = dict.fromkeys(k for r in rows for k in r)
    if schema is not None:
        extra = [n for n in columns if n not in schema.names]
        if extra:
            k = next(k for k, r in enumerate(rows) if extra[0] in r)
            raise InputError(f"stream {name}: row {start + k} has column {extra[0]!r}, "
                             f"which the first rows did not have ({', '.join(schema.names)})")
    if any(len(r) != len(columns) for r in rows):
        # from_pylist takes its columns from the first row: a key only later rows had was
        # dropped, silently. The chunk's columns are all its rows' keys (a row lacking
        # one has NULL there, as in later chunks).
        rows = [{k: r.get(k) for k in columns} for r in rows]
    end = start + len(rows) - 1
    try:
        batch = pa.RecordBatch.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        head = f"stream {name}: rows {start}..{end}" if schema is None else (
            f"stream {name}: rows {start}..{end} do not fit the types of the first rows "
            f"({_describe(schema)})")
        raise _dicts_error(name, head, rows, columns, start, e, schema) from None
    mixed = _check_mixed(name, rows, columns, start, batch.schema)
    if mixed is not None:
        c, error = mixed
        if schema is not None:  # a later chunk: its first value that misfits the column
            head = (f"stream {name}: rows {start}..{end} do not fit the types of the first "
                    f"rows ({_describe(schema)})")
            error = _first_misfit(head, c, [r.get(c) for r in rows], schema, start) or error
        raise error
    if schema is None:
        return batch
    cols, fields = [], []
    for f in schema:
        if f.name not in columns:  # no row of the chunk has it: NULL
            col = pa.nulls(len(rows), f.type)
        else:
            col = batch.column(f.name)
            if pa.types.is_null(f.type):  # a type learnt here (while reading ahead)
                f = f.with_type(col.type)
            elif col.type != f.type:
                try:
                    col = fit(col, f.type, values=True)
                except Misfit as e:
                    if e.row() is None and col.null_count < len(col):
                        # another type throughout: its first value is the one at fault
                        k = next(k for k in range(len(col)) if col[k].is_valid)
                        what = f"row {start + k} has {_shown(col, k)} ({col.type}: {e.why})"
                    else:
                        what = e.describe(start)
                    raise InputError(
                        f"stream {name}: rows {start}..{end} do not fit the types of the "
                        f"first rows: column {f.name!r} is {f.type} there, and "
                        f"{what}; give the column one type in all of its rows") from None
        cols.append(col)
        fields.append(f)
    return pa.RecordBatch.from_arrays(cols, schema=pa.schema(fields))


_INT64 = (-2**63, 2**63 - 1)


def _dicts_error(name: str, head: str, rows: list, columns, start: int,
                 e: Exception, schema: pa.Schema | None = None) -> InputError:
    """Why pyarrow could not read a chunk of dicts, naming the column and the row (its own
    message names neither: "Python int too large to convert to C long"). The column: the
    first whose values alone fail; the row: the first integer beyond int64 (pyarrow reads a
    Python int as int64), else, in a later chunk (``schema``: the column's type known), the
    first value that alone does not fit that type, else the shortest failing run of rows
    (an error's cost only). (The shortest failing run named the value after a bad first
    one: '12' then 13 fail as one type at 13, the int.)"""
    for c in columns:
        vals = [r.get(c) for r in rows]
        if _pylist_error(vals) is None:
            continue
        for k, v in enumerate(vals):
            big = _big_int(v)
            if big is not None:
                return InputError(
                    f"stream {name}: row {start + k} has {_brief(big)} in column {c!r}, an "
                    f"integer beyond int64 ({_INT64[0]}..{_INT64[1]}), the type a Python "
                    "int is read as; give such values as decimal.Decimal (the column is "
                    "then a decimal), or yield pyarrow RecordBatches whose column has the "
                    "type (e.g. uint64)")
        misfit = _first_misfit(head, c, vals, schema, start)
        if misfit is not None:
            return misfit
        lo, hi = 0, len(vals) - 1  # the first k whose rows 0..k fail
        while lo < hi:
            mid = (lo + hi) // 2
            if _pylist_error(vals[:mid + 1]) is None:
                lo = mid + 1
            else:
                hi = mid
        why = _pylist_error(vals[:lo + 1]) or _pylist_error(vals)
        return InputError(f"{head}: column {c!r} cannot be one Arrow type: row {start + lo} "
                          f"has {_brief(vals[lo])} ({why})")
    return InputError(f"{head}: {e}")


def _first_misfit(head: str, c: str, vals: list, schema: pa.Schema | None,
                  start: int) -> InputError | None:
    """In a later chunk (``schema``: the types of the first rows), the error naming the
    first of column ``c``'s values that alone does not fit its type; None if none (or the
    type is not known yet)."""
    known = None if schema is None or c not in schema.names else schema.field(c).type
    if known is None or pa.types.is_null(known):
        return None
    for k, v in enumerate(vals):
        why = _misfit(v, known)
        if why is not None:
            return InputError(f"{head}: column {c!r} is {known} there, and row {start + k} "
                              f"has {_brief(v)} ({why}); give the column one type in all "
                              "of its rows")
    return None


def _misfit(v, target: pa.DataType) -> str | None:
    """Why the Python value ``v`` alone does not fit ``target`` (as a later chunk's values
    are fitted, ``fit``), or None."""
    if v is None:
        return None
    try:
        arr = pa.array([v])
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        return str(e)
    try:
        fit(arr, target, values=True)
    except Misfit as e:
        return f"{arr.type}: {e.why}"
    return None


# Kinds of Python values that pyarrow, inferring one type for a chunk's values, converts
# silently into another kind's type: ``[1.5, True]`` became double (True as 1.0),
# ``["a", b"b"]`` binary, ``[date, datetime]`` a date (the time of day dropped). A later
# chunk's values are refused for these (``fit``); within one chunk they are refused too.
_MIXES = (("number", "bool", "a bool, which is not a number"),
          ("bool", "number", "a number, which is not a bool"),
          ("str", "bytes", "bytes, which are not a string"),
          ("bytes", "str", "a string, which is not bytes"))


def _value_kind(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "bool"
    if isinstance(v, numbers.Number):
        return "number"
    if isinstance(v, dt.datetime):
        return "datetime"
    if isinstance(v, dt.date):
        return "date"
    if isinstance(v, str):
        return "str"
    if isinstance(v, (bytes, bytearray, memoryview)):
        return "bytes"
    return "other"


def _not_a_date(v: dt.datetime) -> bool:
    """A datetime that a date does not hold: a time of day, or an instant not at UTC
    midnight (a datetime at midnight is its date, docs/semantics.md §5)."""
    off = v.utcoffset()
    return (v.hour, v.minute, v.second, v.microsecond) != (0, 0, 0, 0) or bool(off)


def _kinds(v, path: str, row: int, first: dict, timed: dict) -> None:
    """Record, per place within a column's values (``path``: "" for the value, "[]" for a
    list's items, ".k" for a dict's field k), the first row of each kind of value there
    (``first``: path -> kind -> (row, value)) and the first datetime a date does not
    hold (``timed``: path -> (row, value))."""
    if v is None:
        return
    if isinstance(v, Mapping):
        for k, x in v.items():
            _kinds(x, f"{path}.{k}", row, first, timed)
        return
    if isinstance(v, np.ndarray) and v.dtype != object:  # one dtype: no mix of kinds
        return
    if isinstance(v, (list, tuple, np.ndarray)):
        for x in v:
            _kinds(x, f"{path}[]", row, first, timed)
        return
    kind = _value_kind(v)
    first.setdefault(path, {}).setdefault(kind, (row, v))
    if kind == "datetime" and path not in timed and _not_a_date(v):
        timed[path] = (row, v)


_KIND_NAMES = {"number": "a number", "bool": "a bool", "str": "a string",
               "bytes": "bytes", "date": "a date"}
_SIMPLE = {int, float, str, bytes, bool, dt.date, dt.datetime}


def _may_convert(t: pa.DataType) -> bool:
    """Whether pyarrow's inference may have turned one kind of value into another in a
    column inferred as ``t``: its leaves hold a float (a bool after a number), binary (a
    string beside bytes) or a date (a datetime after a date)."""
    if pa.types.is_floating(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t) \
            or pa.types.is_date(t):
        return True
    if pa.types.is_struct(t):
        return any(_may_convert(t.field(k).type) for k in range(t.num_fields))
    if pa.types.is_map(t):
        return _may_convert(t.key_type) or _may_convert(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _may_convert(t.value_type)
    return False


def _check_mixed(name: str, rows: list, columns, start: int,
                 inferred: pa.Schema) -> tuple | None:
    """(column, the InputError to raise) for a value that pyarrow converted to another
    kind's type within one chunk of dicts (``_MIXES``; a datetime with a time of day after
    a date, which became a date), else None: such a value is refused wherever it sits, as
    it is when a later chunk holds it (docs/semantics.md §5). Only a column whose inferred
    type (``inferred``) has a floating, binary or date leaf can hold such a value (pyarrow
    refuses the other mixes itself), and one whose values are of one plain Python type is
    exact: neither is walked."""
    end = start + len(rows) - 1
    for c in columns:
        if not _may_convert(inferred.field(c).type):
            continue
        vals = [r.get(c) for r in rows]
        types = set(map(type, vals)) - {type(None)}
        if len(types) <= 1 and types <= _SIMPLE:
            continue
        if not any(issubclass(t, (Mapping, list, tuple, np.ndarray)) for t in types):
            # scalars of several types: only a mix of kinds above can lose a value
            kinds = {_value_kind(next(v for v in vals if type(v) is t)) for t in types}
            if not ({"date", "datetime"} <= kinds or any(
                    {held, bad} <= kinds for held, bad, _ in _MIXES)):
                continue
        first: dict = {}
        timed: dict = {}
        for k, v in enumerate(vals):
            _kinds(v, "", k, first, timed)
        found = []  # (row, value, what the column holds, its first row, why)
        for path, kinds in first.items():
            for held, bad, why in _MIXES:
                if held in kinds and bad in kinds and kinds[held][0] <= kinds[bad][0]:
                    found.append((kinds[bad], path, held, kinds[held][0], why))
            if "date" in kinds and path in timed:
                found.append((timed[path], path, "date", kinds["date"][0],
                              "a time of day, which a date does not hold"))
        if found:
            (k, v), path, held, k0, why = min(found, key=lambda f: f[0][0])
            where = f"column {c!r}" + (f" (within its values, at {c}{path})" if path else "")
            return c, InputError(
                f"stream {name}: rows {start}..{end}: {where} holds {_KIND_NAMES[held]} in "
                f"row {start + k0}, and row {start + k} has {_brief(v)} ({why}); give the "
                "column one type in all of its rows")
    return None


def _pylist_error(vals: list) -> str | None:
    try:
        pa.array(vals)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        return str(e)
    return None


def _big_int(v) -> int | None:
    """The first int beyond int64 in a value (within lists, tuples and dicts too)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v if not _INT64[0] <= v <= _INT64[1] else None
    items = v.values() if isinstance(v, Mapping) else v if isinstance(v, (list, tuple)) else ()
    return next((b for b in map(_big_int, items) if b is not None), None)


def _brief(v) -> str:
    try:
        text = repr(v)
    except ValueError:  # an int of more than 4300 digits
        return f"an integer of {v.bit_length()} bits"
    return text if len(text) <= 100 else text[:97] + "..."


class Misfit(ValueError):
    """A column that ``fit`` cannot give another type without changing a value."""

    def __init__(self, col: pa.Array, target: pa.DataType, values: bool, why: str):
        super().__init__(why)
        self.col, self.target, self.values, self.why = col, target, values, why

    def row(self) -> int | None:
        """The first row whose value does not fit (None: the type itself is refused). Found
        a row at a time: an error's cost only."""
        if not _convertible(self.col.type, self.target, self.values):
            return None
        for k in range(len(self.col)):
            try:
                fit(self.col.slice(k, 1), self.target, self.values)
            except Misfit:
                return k
        return None

    def at(self, start: int) -> str:
        """``: row N has V, which does not fit (why)`` for a value that does not fit."""
        k = self.row()
        if k is None:
            return ""
        return f": row {start + k} has {_shown(self.col, k)}, which does not fit ({self.why})"

    def describe(self, start: int) -> str:
        k = self.row()
        if k is None:
            return f"these rows give it {self.col.type} ({self.why})"
        return f"row {start + k} has {_shown(self.col, k)} ({self.why})"


def _shown(col: pa.Array, k: int) -> str:
    try:
        return repr(col.slice(k, 1).to_pylist()[0])
    except (ValueError, OverflowError, pa.ArrowException):
        return str(col.slice(k, 1))


def _is(*names: str):
    """A test for any of ``pa.types``' named tests (those a pyarrow lacks: never)."""
    tests = [getattr(pa.types, n) for n in names if hasattr(pa.types, n)]
    return lambda t: any(test(t) for test in tests)


_FAMILIES = (
    ("int", pa.types.is_integer), ("float", pa.types.is_floating),
    ("decimal", pa.types.is_decimal), ("timestamp", pa.types.is_timestamp),
    ("date", pa.types.is_date), ("time", pa.types.is_time),
    ("duration", pa.types.is_duration), ("bool", pa.types.is_boolean),
    ("string", _is("is_string", "is_large_string", "is_string_view")),
    ("binary", _is("is_binary", "is_large_binary", "is_binary_view")),
    ("map", pa.types.is_map),  # (a map is a list type too: before "list")
    ("list", _is("is_list", "is_large_list", "is_fixed_size_list", "is_list_view",
                 "is_large_list_view")),
    ("struct", pa.types.is_struct),
)
"""Families of types whose values convert exactly, by checked casts (``fit``)."""

# Python values of one type may arrive as another that holds them exactly (2 == 2.0, a
# datetime at midnight is its date); a float and a decimal never hold each other's values.
_VALUE_FAMILIES = {("int", "float"), ("float", "int"), ("int", "decimal"), ("decimal", "int"),
                   ("timestamp", "date")}


def _family(t: pa.DataType) -> str | None:
    return next((name for name, test in _FAMILIES if test(t)), None)


def _convertible(a: pa.DataType, b: pa.DataType, values: bool) -> bool:
    """Whether values of type ``a`` may be read as ``b`` (a cast that then checks them):
    the same family (lists, structs and maps: of convertible items; floats: no narrower),
    or with ``values`` (Python values), numbers of another kind, datetimes as dates."""
    if pa.types.is_dictionary(a):
        a = a.value_type
    if pa.types.is_dictionary(b):
        b = b.value_type
    if a == b or pa.types.is_null(a):
        return True
    fa, fb = _family(a), _family(b)
    if fa is None or fb is None:
        return False
    if fa != fb:
        return values and (fa, fb) in _VALUE_FAMILIES
    if fa == "float":
        return a.bit_width <= b.bit_width
    if fa == "list":
        return _convertible(a.value_type, b.value_type, values)
    if fa == "map":
        return (_convertible(a.key_type, b.key_type, values)
                and _convertible(a.item_type, b.item_type, values))
    if fa == "struct":
        theirs = {f.name: f.type for f in b}
        return all(f.name in theirs and _convertible(f.type, theirs[f.name], values)
                   for f in a)
    return True


def _to_date(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether a cast from ``a`` to ``b`` reads a timestamp as a date (anywhere within)."""
    if pa.types.is_dictionary(a):
        a = a.value_type
    if pa.types.is_timestamp(a):
        return pa.types.is_date(b)
    fa = _family(a)
    if fa == "list" and fa == _family(b):
        return _to_date(a.value_type, b.value_type)
    if fa == "map" and fa == _family(b):
        return _to_date(a.key_type, b.key_type) or _to_date(a.item_type, b.item_type)
    if fa == "struct" and fa == _family(b):
        theirs = {f.name: f.type for f in b}
        return any(_to_date(f.type, theirs[f.name]) for f in a if f.name in theirs)
    return False


def fit(col: pa.Array, target: pa.DataType, values: bool = False) -> pa.Array:
    """``col`` as type ``target``, every value kept exactly, or ``Misfit``. Only types of
    one family convert (integers of any width, a float to a wider one, decimals, timestamps,
    dates, times or durations of any unit, string types, binary types; nested types item by
    item), and ``values`` (dicts' Python values) adds numbers of another kind and datetimes
    at midnight as dates. Arrow's checked cast refuses a value that does not fit (an int
    out of range, 1.5 as an integer, lost digits); a datetime's time of day, which the cast
    to a date drops unchecked, by casting back. An int never becomes a string, nor a
    string a number, as ``cast`` alone would do."""
    if not _convertible(col.type, target, values):
        raise Misfit(col, target, values, "another type")
    try:
        out = col.cast(target)  # safe: refuses a value it would change
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise Misfit(col, target, values, str(e)) from None
    if _to_date(col.type, target) and not out.cast(col.type).equals(col):
        raise Misfit(col, target, values, "a time of day, which a date does not hold")
    return out


def normalize(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Timestamps become naive UTC (what the engine compares); dictionaries are decoded.
    A dictionary's decoded values are timestamps with a time zone too (pandas' Categorical
    of aware datetimes): decoded, then made naive, as a plain column of them is."""
    cols, changed = [], False
    for col in batch.columns:
        t = _naive(value_type(col.type))
        if t != col.type:
            col, changed = col.cast(t), True
        cols.append(col)
    return pa.RecordBatch.from_arrays(cols, names=batch.schema.names) if changed else batch


def value_type(t: pa.DataType) -> pa.DataType:
    """The type the engine sees for an input column of type ``t`` (see ``normalize``)."""
    if pa.types.is_dictionary(t):
        return t.value_type
    return t


def column_kind(t: pa.DataType) -> str:
    """The query's kind of a column (``query.cql.KINDS``). Decimals and dates have their own
    kinds, of the number and timestamp families (``query.expr.kind_family``): a literal
    compared with them is read as an exact decimal or as a date."""
    t = value_type(t)
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return "number"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return "list"
    if pa.types.is_map(t):  # (a weighted set for INNER_PRODUCT: docs/shedding.md)
        return "map"
    if pa.types.is_struct(t):
        return "struct"
    if pa.types.is_null(t):
        return "null"
    return "other"


def schema_kinds(schema: pa.Schema | pa.Table) -> dict[str, str]:
    if isinstance(schema, pa.Table):
        schema = schema.schema
    return {f.name: column_kind(f.type) for f in schema}


def naive_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of ``normalize``d batches (dictionaries decoded, timezones dropped)."""
    return pa.schema([pa.field(f.name, _naive(value_type(f.type))) for f in schema])


def _naive(t: pa.DataType) -> pa.DataType:
    return pa.timestamp(t.unit) if pa.types.is_timestamp(t) and t.tz is not None else t
