"""Adaptive policies (a-caching.txt Figure 4's Re-optimizer): the initial plan from the
optimizer and A-Greedy (``reorder``), A-Caching (``acaching``, with the pure cache
selection algorithms in ``caching``), composed as a list by :func:`make_policies` and
attached to a running query, which shares its one Profiler with all of them
(``engine.protocols.Policy``)."""

from __future__ import annotations

from adaptcq.adapt.compose import make_policies

__all__ = ["make_policies"]
