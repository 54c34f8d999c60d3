"""``ContinuousQuery.snapshot`` / ``restore`` refusing what they cannot carry
(docs/architecture.md): executors whose state a snapshot does not hold (the load-shedding
join, the operator tree), another query, another mode or executor, and blobs that are no
snapshot (truncated, a byte flipped, another object), each with an error saying which; a
snapshot of the right query still continues exactly, and one from before the checksum
still restores."""
from __future__ import annotations

import pickle

import pytest

from adaptcq.engine import continuous
from adaptcq.engine.continuous import ContinuousQuery
from adaptcq.errors import OptionError
from adaptcq.query.cql import parse_query

SCHEMA = {"a": "number", "id": "number"}
SQL = ("SELECT R.id AS r, S.id AS s FROM R [RANGE 5 SECONDS], S [RANGE 5 SECONDS] "
       "WHERE R.a = S.a")
Q = parse_query(SQL, {"R": SCHEMA, "S": SCHEMA})
STREAMS, TS, ROWS = [0, 1, 0, 1], [0.0, 1.0, 2.0, 9.0], [(1, 1), (1, 2), (1, 3), (1, 4)]


def started(mode="retract", executor="mjoin", **options) -> ContinuousQuery:
    cq = ContinuousQuery(Q, executor, mode, **options)
    cq.process(STREAMS[:2], None, TS[:2], ROWS[:2])
    return cq


@pytest.mark.parametrize("executor, what", [("shed", "basic windows"),
                                            ("tree", "spilled generations")])
def test_a_snapshot_of_an_executor_it_cannot_hold_is_refused(executor, what):
    """It was taken without the state (the shed join's restore lost every window; the
    tree's snapshot raised AttributeError)."""
    with pytest.raises(OptionError, match=f"the {executor} executor's state .*{what}"):
        started("append", executor).snapshot()


@pytest.mark.parametrize("other", [
    ("SELECT R.id AS r, S.id AS s FROM S [RANGE 5 SECONDS], R [RANGE 5 SECONDS] "
     "WHERE R.a = S.a"),                                  # FROM order: rows in other streams
    SQL.replace("R [RANGE 5 SECONDS]", "R [RANGE 6 SECONDS]"),
    SQL.replace("R [RANGE 5 SECONDS]", "R [ROWS 5]"),
    SQL + " AND R.id > 0",
    SQL.replace("S.id AS s", "S.id AS t"),
])
def test_restore_refuses_another_query(other):
    blob = started().snapshot()
    with pytest.raises(OptionError, match="the query differs from the one snapshotted"):
        ContinuousQuery.restore(parse_query(other, {"R": SCHEMA, "S": SCHEMA}), blob)


def test_the_same_query_parsed_again_continues_exactly_in_the_snapshots_mode():
    want = ContinuousQuery(Q, "mjoin", "retract").process(STREAMS, None, TS, ROWS)
    first = ContinuousQuery(Q, "mjoin", "retract")
    got = first.process(STREAMS[:2], None, TS[:2], ROWS[:2])
    again = ContinuousQuery.restore(parse_query(SQL, {"R": SCHEMA, "S": SCHEMA}),
                                    first.snapshot())  # mode left out: the snapshot's
    assert again.mode == "retract"
    got += again.process(STREAMS[2:], None, TS[2:], ROWS[2:])
    assert sorted(map(repr, got)) == sorted(map(repr, want))
    assert any(r[-2] == -1 for r in want)  # a retraction: the mode carried over


def test_restore_refuses_another_mode_and_an_executor():
    blob = started("append").snapshot()
    with pytest.raises(OptionError, match="mode='retract' differs from the snapshot's "
                                          "mode='append'"):
        ContinuousQuery.restore(Q, blob, "retract")
    with pytest.raises(OptionError, match="executor= is not taken"):
        ContinuousQuery.restore(Q, blob, executor="xjoin")
    assert ContinuousQuery.restore(Q, blob, "append").mode == "append"


def test_a_blob_that_is_no_snapshot_is_a_clear_error():
    blob = started().snapshot()
    flipped = bytearray(blob)
    flipped[-5] ^= 0x01
    for bad, message in ((blob[:-10], "damaged or truncated"),
                         (bytes(flipped), "damaged or truncated"),
                         (b"", "does not unpickle"),
                         (pickle.dumps([1, 2]), "not a ContinuousQuery snapshot \\(a list\\)"),
                         (pickle.dumps({"version": 1}), "no 'executor'"),
                         (pickle.dumps({"version": 7}), "unknown snapshot version 7")):
        with pytest.raises(ValueError, match=message):
            ContinuousQuery.restore(Q, bad)


def test_a_snapshot_from_before_the_checksum_still_restores():
    """The pickled state alone (no tag, no digest), as snapshots were written before."""
    blob = started().snapshot()
    assert blob.startswith(continuous._SNAPSHOT_TAG)
    legacy = blob[len(continuous._SNAPSHOT_TAG) + 32:]
    again = ContinuousQuery.restore(Q, legacy)
    assert again.executor.state_tuples() == 2
