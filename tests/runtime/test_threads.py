"""One Context used from several threads: calls and compiles give the values they give alone."""

from __future__ import annotations

import threading

import torch

from mlsdk import Context, MNDevice

THREADS, CALLS = 4, 50


def producer(d):
    return {"h": torch.relu(d["x"] * 2 - 1)}


def run_threads(target, n: int) -> list:
    results: list = [None] * n
    errors: list = []

    def body(i: int) -> None:
        try:
            results[i] = target(i)
        except BaseException as e:  # noqa: BLE001 - reported below, with its thread
            errors.append((i, e))
    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"threads failed: {errors}"
    return results


def test_calls_from_four_threads_equal_the_single_thread_results(tmp_path):
    """Each thread runs a chain (host upload, a proxy handed over, a registered weight) 50 times
    with inputs of its own; every output equals the one the same call gave in one thread."""
    torch.manual_seed(0)
    ctx = Context(MNDevice("mini:auto"))
    model = torch.nn.Linear(16, 8)
    ctx.registry.register("model", model)
    first = ctx.compile(producer, {"x": torch.zeros(4, 16)}, None)
    second = ctx.compile(lambda d: {"y": model(d["h"])}, {"h": torch.zeros(4, 16)}, None)
    inputs = [[torch.randn(4, 16) for _ in range(CALLS)] for _ in range(THREADS)]

    def chain(x: torch.Tensor) -> torch.Tensor:
        return second(first({"x": x}))["y"].cpu()
    alone = [[chain(x) for x in xs] for xs in inputs]
    with torch.no_grad():
        assert torch.allclose(alone[0][0], model(torch.relu(inputs[0][0] * 2 - 1)), atol=1e-5)

    together = run_threads(lambda i: [chain(x) for x in inputs[i]], THREADS)
    wrong = [(i, k) for i in range(THREADS) for k in range(CALLS) if not torch.equal(together[i][k], alone[i][k])]
    assert not wrong, f"{len(wrong)} of {THREADS * CALLS} outputs differ from the single-thread run: {wrong[:5]}"
    assert len(ctx.session.calls) == 2 * 2 * THREADS * CALLS


def test_compiles_from_two_threads(tmp_path):
    ctx = Context(MNDevice("mini:auto"))
    x = torch.randn(8, 16)
    fns = [lambda d: {"y": d["x"].exp() + 1}, lambda d: {"y": (d["x"] @ d["x"].T).sum(dim=-1)}]
    expected = [f({"x": x})["y"] for f in fns]
    compiled = run_threads(lambda i: ctx.compile(fns[i], {"x": x}, tmp_path / str(i)), 2)
    for fn, want in zip(compiled, expected):
        assert torch.allclose(fn({"x": x})["y"].cpu(), want, rtol=1e-4, atol=1e-4)
    assert len(ctx.functions) == 2
