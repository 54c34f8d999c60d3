"""Restarting a Spark checkpoint written before its fingerprint recorded the output's
columns (2026-11-27): refused only where this version writes other columns for the query
(``--executor tree`` now adds ``_late`` without spilling; ``SELECT *`` leaves the ``--sign``
column out), since a restart appends part files to the same output. No Spark job runs:
``prepare_files`` does these checks before Spark starts."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from adaptcq.errors import AdaptcqError
from adaptcq.runtime.spark import FINGERPRINT, OUTPUT_MARKER, prepare_files


def _old_checkpoint(tmp_path, sql, srcs, **kw):
    """A checkpoint as an earlier version left it: one committed micro-batch, and the
    fingerprint this version writes without its "columns"."""
    job = prepare_files(sql, srcs, tmp_path / "ck", str(tmp_path / "out"), **kw)
    ck = tmp_path / "ck"
    (ck / "query" / "commits").mkdir(parents=True)
    (ck / "query" / "commits" / "0").write_text("v1\n")
    fp = dict(job.fingerprint)
    fp.pop("columns")
    fp["run"] = "r1"
    (ck / FINGERPRINT).write_text(json.dumps(fp))
    out = tmp_path / "out"  # its output, claimed by its run
    out.mkdir()
    (out / OUTPUT_MARKER).write_text(json.dumps({"run": "r1", "checkpoint": str(ck)}))


@pytest.fixture
def srcs(tmp_path):
    for name in "rs":
        pq.write_table(pa.table({"ts": [1.0, 2.0], "a": [1, 1], "sg": [1, 1]}),
                       tmp_path / f"{name}.parquet")
    return {"R": str(tmp_path / "r.parquet"), "S": str(tmp_path / "s.parquet")}


@pytest.mark.parametrize(("sql", "kw", "why"), [
    ("SELECT * FROM R, S WHERE R.a = S.a", {"sign": "sg"}, "R_sg, .*_ts; this version writes"),
    ("SELECT R.a FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] WHERE R.a = S.a",
     {"executor": "tree"}, "a, _sign, _ts; this version writes a, _sign, _ts, _late"),
])
def test_an_old_checkpoint_whose_columns_changed_is_refused(tmp_path, srcs, sql, kw, why):
    _old_checkpoint(tmp_path, sql, srcs, **kw)
    with pytest.raises(AdaptcqError, match="its output's columns were .*" + why):
        prepare_files(sql, srcs, tmp_path / "ck", str(tmp_path / "out"), **kw)


@pytest.mark.parametrize(("sql", "kw"), [
    ("SELECT R.a AS x FROM R, S WHERE R.a = S.a", {"sign": "sg"}),
    ("SELECT R.a FROM R [RANGE 1 SECONDS], S [RANGE 1 SECONDS] WHERE R.a = S.a", {}),
])
def test_an_old_checkpoint_with_the_same_columns_restarts(tmp_path, srcs, sql, kw):
    _old_checkpoint(tmp_path, sql, srcs, **kw)
    job = prepare_files(sql, srcs, tmp_path / "ck", str(tmp_path / "out"), **kw)
    assert job.fingerprint["columns"][-2:] == ["_sign", "_ts"]
