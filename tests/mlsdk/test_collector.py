"""The cyclic collector is held off while mlsdk compiles, and comes back as the caller had it."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from compiler.errors import CompileError
from mlsdk import Context, MNDevice
from mlsdk.collector import collector_held


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_held_inside_and_back_after(collector_on):
    with collector_held():
        assert not gc.isenabled()
        with collector_held():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer hold is still on
    assert gc.isenabled()


def test_back_after_an_error(collector_on):
    with pytest.raises(ValueError):
        with collector_held():
            raise ValueError("inside")
    assert gc.isenabled()


def test_a_caller_who_turned_it_off_keeps_it_off(collector_on):
    gc.disable()
    with collector_held():
        pass
    assert not gc.isenabled()


def test_threads_overlapping_holds(collector_on):
    """The collector comes back when the last of two overlapping holds ends, not the first."""
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with collector_held():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second():
        first_in.wait(5)
        with collector_held():
            second_in.set()
            first_out.wait(5)
            seen["after the first left"] = gc.isenabled()
    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {"after the first left": False}
    assert gc.isenabled()


def test_compile_holds_the_collector_and_gives_it_back(collector_on):
    seen = []
    ctx = Context(MNDevice("mini:auto"))

    def fn(d):
        seen.append(gc.isenabled())  # traced inside compile
        return {"y": d["x"] * 2}
    compiled = ctx.compile(fn, {"x": torch.ones(4, 8)}, None)
    assert seen and not any(seen)
    assert gc.isenabled()
    torch.testing.assert_close(compiled({"x": torch.ones(4, 8)})["y"].cpu(), torch.full((4, 8), 2.0))
    with pytest.raises(CompileError, match="must have same reduction dim"):
        ctx.compile(lambda d: {"y": d["x"] @ d["x"]}, {"x": torch.ones(4, 8)}, None)  # 4x8 @ 4x8: torch refuses
    assert gc.isenabled()
