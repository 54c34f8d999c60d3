"""``adaptcq explain``: the join graph, each ordering algorithm's plan and cost.

(Being written: issue 4. The arguments below are the contract with cli.py.)
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sql", required=True, help="the CQL query text, or @FILE")
    p.add_argument("--input", action="append", default=[], metavar="NAME=PATH",
                   help="measure statistics by running over these inputs")
    p.add_argument("--timestamp", default="ts")
    p.add_argument("--stats", metavar="FILE",
                   help="JSON statistics: {rates: {S: λ}, selectivities: {'R,S': σ}, window: W}")
    p.add_argument("--prefix", type=int, default=200_000,
                   help="measure statistics over at most this many input rows")


def main(args) -> int:
    raise NotImplementedError("adaptcq explain is being written (issue 4)")
