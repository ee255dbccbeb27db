"""A product whose only reader is its transpose, (A B)^T, is computed as B^T A^T
(`compiler.planner.rewrite`): A and B are read through transposed views, where transposing the
product would move every element of it across the lanes."""

from __future__ import annotations

import pytest
import torch

import hwdesc
import compiler.planner.rewrite as rewrite_module
from compiler.compile import compile_function
from compiler.frontend.tracing import trace
from compiler.planner.rewrite import rewrite
from runtime import Device
from sim import Machine


@pytest.mark.parametrize("m, k, n", [(64, 256, 512), (256, 64, 32)])
def test_a_transposed_product_is_computed_as_the_product_of_the_transposes(monkeypatch, m, k, n):
    hw = hwdesc.load("mini")
    torch.manual_seed(m)
    inputs = {"a": torch.randn(m, k), "b": torch.randn(k, n)}
    fn = lambda d: {"c": (d["a"] @ d["b"]).T}  # noqa: E731
    graph = trace(fn, inputs, None)
    rewrite(graph, hw)
    product = next(node for node in graph.nodes if node.kind == "matmul")
    assert [list(v.shape) for v in product.args] == [[n, k], [k, m]]  # B^T A^T
    assert product.out is graph.outputs["c"]  # no transpose after it
    device, machine = Device(hw), Machine(hw)
    compiled = compile_function(fn, inputs, hw)
    torch.testing.assert_close(device.execute(compiled, inputs)["c"], fn(inputs)["c"], rtol=1e-4, atol=1e-3)
    monkeypatch.setattr(rewrite_module, "_transposed_products", lambda graph: {})
    as_traced = compile_function(fn, inputs, hw)
    assert machine.time(compiled.program.code).total_cycles < machine.time(as_traced.program.code).total_cycles
