"""The planner stops timing a kind of candidates whose timings cluster (convolutions) once
STALE_CANDIDATES in a row have not bettered the best by STALE_GAIN; other kinds are all timed."""

from __future__ import annotations

import pytest
import torch

import hwdesc
from compiler.frontend.tracing import trace
from compiler.kernels.base import Kernel
from compiler.planner import search


class Candidate(Kernel):
    """A candidate that takes `cycles` when timed and reads its inputs as they lie (`relaid`: one
    relayout first, which costs nothing here)."""

    def __init__(self, cycles: int, clusters: bool, relaid: bool = False) -> None:
        self.cycles, self.stops_when_stale, self.relaid = cycles, clusters, relaid


@pytest.fixture
def planner(monkeypatch):
    graph = trace(lambda d: {"y": d["x"] + 1}, {"x": torch.randn(4)}, None)
    planner = search.Planner(graph, hwdesc.load("mini"), {}, {})
    planner.timed = []

    def time(kernel, refs, limit=None):
        planner.timed.append(kernel)
        return kernel.cycles
    monkeypatch.setattr(planner, "prepare", lambda k, allow: ({}, [object()] if k.relaid else [], []))
    monkeypatch.setattr(planner, "time", time)
    monkeypatch.setattr(planner, "priced_within", lambda pre, alone, limit, budget=None: alone)
    for name in ("meet_cycles", "sibling_cycles", "host_cycles"):
        monkeypatch.setattr(planner, name, lambda *a: 0)
    monkeypatch.setattr(planner, "spread_key", lambda *a: (0, 0))
    return planner


def test_clustering_candidates_stop_after_a_stale_streak(planner):
    stale = search.STALE_CANDIDATES
    # the first sets the best; the next `stale` better it by less than STALE_GAIN each: the
    # much faster one after them is not timed
    slowly_better = [Candidate(1000 - k, True) for k in range(stale + 1)]
    late = Candidate(500, True)
    (_, best, *_), _ = planner._best(slowly_better + [late], True)
    assert planner.timed == slowly_better and best is slowly_better[-1]
    # a gain of STALE_GAIN or more restarts the streak
    planner.timed.clear()
    gained = 998 * (1 - search.STALE_GAIN) - 1
    steps = [Candidate(c, True) for c in [1000, 999, 998, gained] + [gained - 1 - k for k in range(stale - 1)] + [500]]
    (_, best, *_), _ = planner._best(steps, True)
    assert best is steps[-1] and len(planner.timed) == len(steps)


def test_the_streak_restarts_for_candidates_that_relay_an_input(planner):
    stale = search.STALE_CANDIDATES
    as_they_lie = [Candidate(1000 - k, True) for k in range(stale + 3)]
    relaid = Candidate(400, True, relaid=True)
    (_, best, *_), _ = planner._best(as_they_lie + [relaid], True)
    assert best is relaid and planner.timed == as_they_lie[:stale + 1] + [relaid]


def test_other_kinds_are_all_timed(planner):
    candidates = [Candidate(1000 - k, False) for k in range(search.STALE_CANDIDATES + 1)] + [Candidate(500, False)]
    (_, best, *_), _ = planner._best(candidates, True)
    assert best is candidates[-1] and planner.timed == candidates
