"""The benchmark commands' shared argument types (``bench._args``)."""

from __future__ import annotations

import argparse

import pytest

from adaptcq.bench import _args


@pytest.mark.parametrize(("kind", "good", "bad"), [
    (_args.positive_int, [("1", 1), ("30", 30)], ["0", "-2", "1.5", "x"]),
    (_args.nonnegative_int, [("0", 0), ("7", 7)], ["-1", "x"]),
    (_args.positive_float, [("0.5", 0.5), ("3", 3.0)], ["0", "-1", "inf", "nan", "x"]),
    (_args.nonnegative_float, [("0", 0.0)], ["-0.1", "inf"]),
    (_args.fraction, [("1", 1.0), ("0.25", 0.25)], ["0", "1.5", "nan"]),
])
def test_number_types_take_what_they_say_and_name_the_rest(kind, good, bad):
    for text, value in good:
        assert kind(text) == value
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError):
            kind(text)


def test_choices_and_unused_options_are_refused(capsys):
    parse = _args.choices(["a", "b", "c"])
    assert parse("a,c") == ["a", "c"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown 'z'"):
        parse("a,z")
    ap = argparse.ArgumentParser(prog="bench")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=3)
    argv = ["--duration", "5"]
    _args.refuse_unused(ap, ["runs"], "by fig7", argv=argv)        # not given: fine
    with pytest.raises(SystemExit):
        _args.refuse_unused(ap, ["duration", "runs"], "by fig7", argv=argv)
    assert "--duration: not used by fig7" in capsys.readouterr().err


def test_comma_lists_check_each_value():
    parse = _args.comma_list(_args.positive_int, "number")
    assert parse("1, 2,4") == [1, 2, 4]
    for bad, message in (("", "give at least one number"), ("1,0", "must be at least 1"),
                         ("1,,4", "item 2 of the comma-separated list is empty"),
                         ("1,4,", "item 3 of the comma-separated list is empty"),
                         (" , ", "item 1 of")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            parse(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="item 2 .* give a name in each"):
        _args.choices(["a", "b"])("a,,b")


def test_the_data_sources_rates_refuse_an_empty_item():
    """The `adaptcq` Spark data source's nway `rates` option: an empty item is refused by
    its position ("1,,2" was read as two rates)."""
    from adaptcq.stream.datasource import _kwargs
    assert _kwargs({"workload": "nway", "rates": "1, 2"}) == ("nway", {"rates": [1.0, 2.0]})
    assert _kwargs({"workload": "nway", "rates": "R:1,S:2"})[1]["rates"] == {"R": 1.0, "S": 2.0}
    for bad, k in (("1,,2", 2), ("1,2,", 3)):
        with pytest.raises(ValueError, match=f"item {k} is empty"):
            _kwargs({"workload": "nway", "rates": bad})
