"""CacheOptions, compile_automap, load_codegen_dir (also in a fresh process), trace files and
the pfvm:cpu reference device."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import subprocess
import sys
from typing import NamedTuple

import pytest
import torch

import compiler.compile as compile_module
from compiler.artifact import ArtifactError
from mlsdk import (ArgumentError, CacheOptions, CompiledFunction, Context, MNDevice, TensorProxy,
                   register_pytree_dataclass, register_pytree_namedtuple, set_tensor_name, storage, trace_event,
                   trace_scope)

Dict = dict[str, torch.Tensor]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def scale(d: Dict) -> Dict:
    return {"y": d["x"] * 3}


@pytest.fixture
def ctx() -> Context:
    return Context(MNDevice("mini:auto"))


@pytest.fixture
def count_compiles(monkeypatch):
    calls = []
    real = compile_module.compile_graph

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(compile_module, "compile_graph", counting)
    return calls


def test_cache_options_reuse_an_unchanged_compile(ctx, tmp_path, count_compiles):
    cache = CacheOptions(str(tmp_path / "cache"), enable_app_cache=True, enable_onnx_cache=True,
                         enable_codegen_cache=True, enable_gpfn2obj_cache=True)
    x = torch.randn(4, 8)
    first = ctx.compile(scale, {"x": x}, tmp_path / "a", cache_options=cache)
    second = ctx.compile(scale, {"x": x}, tmp_path / "b", cache_options=cache)
    assert len(count_compiles) == 1
    assert torch.equal(second({"x": x})["y"].cpu(), x * 3)
    assert second.input_specs == first.input_specs
    # any change of function, input shape, options or chip compiles again
    ctx.compile(lambda d: {"y": d["x"] * 4}, {"x": x}, tmp_path / "c", cache_options=cache)
    ctx.compile(scale, {"x": torch.randn(4, 16)}, tmp_path / "d", cache_options=cache)
    ctx.compile(scale, {"x": x}, tmp_path / "e", cache_options=cache, options={"float_dtype": "mixed"})
    Context(MNDevice("mncore2_2groups:auto")).compile(scale, {"x": x}, tmp_path / "f", cache_options=cache)
    assert len(count_compiles) == 5
    ctx.compile(scale, {"x": x}, tmp_path / "g", cache_options=CacheOptions(str(tmp_path / "cache"),
                                                                             enable_app_cache=False))
    assert len(count_compiles) == 6


def test_pfn_examples_compile_helper_keeps_its_cache_inside_the_codegen_dir(ctx, tmp_path, count_compiles):
    """PFN's ncf_training utility: `codegen_dir=outdir/name` with `CacheOptions(outdir/name/cache)`,
    tensors named through `fx2onnx.set_tensor_name`. The second compile into the same codegen_dir
    takes the cache there; a file mnsim did not write is still refused."""
    import fx2onnx
    from mlsdk import get_tensor_name

    model = torch.nn.Linear(8, 4)
    for name, p in model.named_parameters():
        fx2onnx.set_tensor_name(p, f"ncf@{name}")
        ctx.register_param(p)
    assert get_tensor_name(model.weight) == fx2onnx.get_tensor_name(model.weight) == "ncf@weight"
    codegen_dir = storage.path(str(tmp_path)) / "ncf_eval"
    cache = CacheOptions(f"{tmp_path}/ncf_eval/cache", enable_app_cache=True, enable_onnx_cache=True,
                         enable_codegen_cache=True, enable_gpfn2obj_cache=True)
    x = torch.randn(3, 8)
    for _ in range(2):
        fn = ctx.compile(lambda d: {"y": model(d["x"])}, {"x": x}, codegen_dir, cache_options=cache,
                         options={"option_json": "/opt/pfn/pfcomp/codegen/preset_options/O1.json"})
    assert len(count_compiles) == 1
    with torch.no_grad():
        assert torch.allclose(fn({"x": x})["y"].cpu(), model(x), atol=1e-6)
    (tmp_path / "ncf_eval" / "notes.txt").write_text("mine")
    with pytest.raises(ArtifactError, match=r"holds notes\.txt, which mnsim did not write"):
        ctx.compile(lambda d: {"y": model(d["x"]) * 2}, {"x": x}, codegen_dir)


def test_a_broken_cache_entry_is_rebuilt(ctx, tmp_path, count_compiles):
    cache = CacheOptions(str(tmp_path / "cache"))
    ctx.compile(scale, {"x": torch.zeros(2, 2)}, tmp_path / "a", cache_options=cache)
    (entry,) = (tmp_path / "cache").iterdir()
    (entry / "program.npz").write_bytes(b"garbage")
    fn = ctx.compile(scale, {"x": torch.zeros(2, 2)}, tmp_path / "b", cache_options=cache)
    assert len(count_compiles) == 2
    assert torch.equal(fn({"x": torch.ones(2, 2)})["y"].cpu(), torch.full((2, 2), 3.0))


@register_pytree_namedtuple
class Pair(NamedTuple):
    left: torch.Tensor
    right: torch.Tensor


@register_pytree_dataclass
@dataclasses.dataclass
class Scaled:
    value: torch.Tensor
    factor: torch.Tensor


def test_compile_automap_takes_the_original_signature(ctx, tmp_path):
    def combine(pair: Pair, items: list, *, scaled: Scaled) -> torch.Tensor:
        return pair.left - pair.right + items[0] + scaled.value * scaled.factor

    a, b, c, v, f = (torch.randn(4, 8) for _ in range(5))
    fn = ctx.compile_automap(combine, (Pair(a, b), [c]), {"scaled": Scaled(v, f)}, tmp_path / "auto")
    out = fn(Pair(a, b), [c], scaled=Scaled(v, f))
    assert isinstance(out, TensorProxy), "a single-tensor result comes back as one proxy"
    assert torch.allclose(out.cpu(), a - b + c + v * f, atol=1e-6)

    def two(x: torch.Tensor) -> Dict:
        return {"double": x * 2, "half": x / 2}
    fn2 = ctx.compile_automap(two, (a,), {}, tmp_path / "two")
    out2 = fn2(a)
    assert set(out2) == {"double", "half"} and torch.allclose(out2["half"].cpu(), a / 2)
    assert isinstance(fn, CompiledFunction) and isinstance(fn2, CompiledFunction)


def test_compile_automap_codegen_dir_reloads_with_the_original_signature(ctx, tmp_path):
    """The codegen_dir records the calling convention: reloaded (here or in a new Context), the
    function takes the positional and keyword arguments again, not a dict of 'args.0' inputs."""
    a, b = torch.randn(3), torch.randn(3)
    ctx.compile_automap(lambda x, *, y: x * y, (a,), {"y": b}, tmp_path / "am")
    ctx.compile_automap(lambda x: {"s": x + 1}, (a,), None, tmp_path / "dict")
    again = Context(MNDevice("mini:auto"))
    single, named = again.load_codegen_dir(tmp_path / "am"), again.load_codegen_dir(tmp_path / "dict")
    assert torch.allclose(single(a, y=b).cpu(), a * b) and torch.allclose(named(a)["s"].cpu(), a + 1)
    reference = Context(MNDevice("pfvm:cpu"))  # the convention is kept in pfvm:cpu's codegen_dir too
    reference.compile_automap(lambda x, *, y: x * y, (a,), {"y": b}, tmp_path / "am_cpu")
    assert torch.allclose(Context(MNDevice("pfvm:cpu")).load_codegen_dir(tmp_path / "am_cpu")(a, y=b).cpu(), a * b)
    with pytest.raises(ArgumentError, match="keyword arguments as a dict \\(or None\\), not list"):
        ctx.compile_automap(lambda x: x, (a,), [b], None)


def test_compile_automap_traces_the_function_once(ctx, tmp_path):
    calls = []

    def f(x):
        calls.append(1)
        return x + 1
    fn = ctx.compile_automap(f, (torch.zeros(2, 2),), {}, tmp_path / "once")
    assert len(calls) == 1, "the function runs once, to be traced"
    assert torch.equal(fn(torch.ones(2, 2)).cpu(), torch.full((2, 2), 2.0))


class Encoding(collections.UserDict):
    """Like a tokenizer's BatchEncoding: a Mapping that is not a dict, its keys also attributes."""

    def __getattr__(self, name: str):
        try:
            return self.data[name]
        except KeyError:
            raise AttributeError(name) from None


def test_a_mapping_that_is_not_a_dict_is_inputs_like_a_dict(ctx, tmp_path):
    """PFN's llm_infer.py compiles and calls with the tokenizer's BatchEncoding. torch's pytree
    takes such a Mapping for one leaf: compile said "input 'out' is a UserDict". Its items are the
    inputs now, and the function gets its own class back (attribute access works)."""
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    fn = ctx.compile(lambda d: {"z": d.x * 2 + d["y"]}, Encoding({"x": x, "y": y}), tmp_path / "enc")
    assert list(fn.allocate_input_proxy()) == ["x", "y"]
    torch.testing.assert_close(fn(Encoding({"x": x, "y": y}))["z"].cpu(), x * 2 + y)
    plain = ctx.compile(lambda d: {"z": d["x"] - d["y"]}, {"x": x, "y": y}, tmp_path / "plain")
    torch.testing.assert_close(plain(collections.UserDict({"x": x, "y": y}))["z"].cpu(), x - y)


def test_pytree_registration_rejects_other_types():
    with pytest.raises(TypeError, match="@dataclass"):
        register_pytree_dataclass(int)
    with pytest.raises(TypeError, match="NamedTuple"):
        register_pytree_namedtuple(tuple)


def test_load_codegen_dir_in_this_process(ctx, tmp_path):
    x = torch.randn(4, 8)
    compiled = ctx.compile(scale, {"x": x}, storage.path(str(tmp_path)) / "scale")
    loaded = ctx.load_codegen_dir(storage.path(str(tmp_path)) / "scale")
    assert loaded.input_specs == compiled.input_specs and loaded.output_specs == compiled.output_specs
    assert torch.equal(loaded({"x": x})["y"].cpu(), x * 3)


LOADER = """
import sys, torch
from mlsdk import Context, MNDevice, storage
ctx = Context(MNDevice("mini:auto"))
fn = ctx.load_codegen_dir(storage.path(sys.argv[1]))
x = torch.arange(12.0).reshape(3, 4)
print(sorted(fn.input_specs))
print(fn({"x": x})["y"].cpu().tolist())
"""


def test_load_codegen_dir_in_a_fresh_process_without_the_model(ctx, tmp_path):
    """The artifact carries the registered weights, so a loader need not register the model."""
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 2)
    ctx.registry.register("model", model)
    ctx.compile(lambda d: {"y": model(d["x"])}, {"x": torch.zeros(3, 4)}, tmp_path / "linear")
    run = subprocess.run([sys.executable, "-c", LOADER, str(tmp_path / "linear")], capture_output=True, text=True,
                         cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    names, values = run.stdout.strip().splitlines()[-2:]
    assert names == "['x']"
    expected = model(torch.arange(12.0).reshape(3, 4)).detach()
    assert torch.allclose(torch.tensor(json.loads(values)), expected, atol=1e-5)


def test_pfvm_cpu_codegen_dir_reloads_in_a_fresh_process(tmp_path):
    """PFN's debugging order (original, pfvm:cpu, the chip) runs add.py then load_codegen_dir.py
    on each device: on pfvm:cpu the codegen_dir holds the traced program, with the registered
    weights; loaded where the model is registered, a training step updates the model's tensors.
    Each device refuses the other's directory, naming it."""
    torch.manual_seed(2)
    model = torch.nn.Linear(4, 2)
    ref = Context(MNDevice("pfvm:cpu"))
    ref.registry.register("model", model)
    ref.compile(lambda d: {"y": model(d["x"])}, {"x": torch.zeros(3, 4)}, tmp_path / "linear")
    loader = LOADER.replace('MNDevice("mini:auto")', 'MNDevice("pfvm:cpu")')
    run = subprocess.run([sys.executable, "-c", loader, str(tmp_path / "linear")], capture_output=True, text=True,
                         cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    names, values = run.stdout.strip().splitlines()[-2:]
    expected = model(torch.arange(12.0).reshape(3, 4)).detach()
    assert names == "['x']" and torch.allclose(torch.tensor(json.loads(values)), expected, atol=1e-6)

    weight = torch.nn.Parameter(torch.ones(3))
    set_tensor_name(weight, "w")
    ref.register_param(weight)

    def step(d):
        loss = (weight * d["x"]).sum()
        loss.backward()
        with torch.no_grad():
            weight.sub_(0.5 * weight.grad)
        weight.grad = None
        return {"loss": loss}
    ref.compile(step, {"x": torch.ones(3)}, tmp_path / "step")
    again = Context(MNDevice("pfvm:cpu"))
    mine = torch.nn.Parameter(torch.full((3,), 2.0))
    set_tensor_name(mine, "w")
    again.register_param(mine)
    loaded = again.load_codegen_dir(tmp_path / "step")
    assert loaded({"x": torch.tensor([1.0, 2.0, 3.0])})["loss"].item() == 12.0
    assert mine.tolist() == [1.5, 1.0, 0.5], "the loaded step updates the tensor registered under its name"

    with pytest.raises(ArtifactError, match="holds a pfvm:cpu program \\(reference.pt\\), not a device one"):
        Context(MNDevice("mini")).load_codegen_dir(tmp_path / "linear")
    Context(MNDevice("mini")).compile(scale, {"x": torch.zeros(2)}, tmp_path / "device")
    with pytest.raises(ArtifactError, match="holds a device program; pfvm:cpu loads what a pfvm:cpu compile wrote"):
        again.load_codegen_dir(tmp_path / "device")


def test_load_codegen_dir_errors(ctx, tmp_path):
    with pytest.raises(ArtifactError, match=f"no codegen_dir at {tmp_path / 'missing'}"):
        ctx.load_codegen_dir(storage.path(str(tmp_path / "missing")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactError, match="not a complete mnsim codegen_dir"):
        ctx.load_codegen_dir(tmp_path / "empty")
    Context(MNDevice("mncore2_2groups:auto")).compile(scale, {"x": torch.zeros(2, 2)}, tmp_path / "other")
    with pytest.raises(ArtifactError, match="compiled for chip 'mncore2_2groups'; the device is 'mini'"):
        ctx.load_codegen_dir(tmp_path / "other")
    # the context is still usable
    fn = ctx.compile(scale, {"x": torch.zeros(2, 2)}, tmp_path / "ok")
    assert torch.equal(fn({"x": torch.ones(2, 2)})["y"].cpu(), torch.full((2, 2), 3.0))


def test_trace_scope_writes_host_and_device_tracks(ctx, tmp_path):
    path = tmp_path / "trace.json"
    with trace_scope(str(path)):
        fn = ctx.compile(scale, {"x": torch.zeros(2, 2)}, tmp_path / "s")
        with trace_event("my step"):
            fn({"x": torch.ones(2, 2)})["y"].cpu()
    events = json.loads(path.read_text())["traceEvents"]
    host = {e["name"] for e in events if e.get("pid") == 1 and e["ph"] == "X"}
    assert {"compile scale", "call scale", "my step"} <= host
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert [processes[pid] for pid in sorted(processes)] == [
        "host", "device run 0: upload scale.x", "device run 1: scale", "device run 2: download scale.y"]
    device_runs = [e for e in events if e.get("cat") == "run"]
    assert [e["name"] for e in device_runs] == ["upload scale.x", "scale", "download scale.y"]
    assert len({e["pid"] for e in device_runs}) == 3, "each simulated run on its own track"
    for run in device_runs:
        tracks = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
                  and e["pid"] == run["pid"]}
        assert "run" in tracks and tracks & {"host link", "PE stream", "Data Engine 0"}
    call = ctx.session.calls[-1]
    assert device_runs[1]["dur"] == pytest.approx(call.stats.total_cycles / (call.stats.clock_hz / 1e6))
    host_call = next(e for e in events if e.get("pid") == 1 and e["name"] == "call scale")
    for run in device_runs[:2]:  # the upload and the program ran inside the host call, and are anchored there
        assert host_call["ts"] <= run["ts"] and run["ts"] + run["dur"] <= host_call["ts"] + host_call["dur"] + 1
    assert device_runs[2]["ts"] >= host_call["ts"] + host_call["dur"] - 1, "the download (.cpu()) follows the call"


def test_trace_scope_none_disables_tracing(ctx, tmp_path, monkeypatch):
    from mlsdk import trace
    written = []
    monkeypatch.setattr(trace.Recorder, "write", lambda self, path: written.append(path))
    with trace_scope(None):
        assert trace._active == []
        with trace_event("nothing"):
            ctx.compile(scale, {"x": torch.zeros(2, 2)}, tmp_path / "s")({"x": torch.ones(2, 2)})
    with trace_scope(tmp_path / "t.json"):
        assert len(trace._active) == 1
    assert written == [tmp_path / "t.json"]


def test_pfvm_cpu_runs_the_traced_graph_with_torch(tmp_path):
    ctx = Context(MNDevice("pfvm:cpu"))
    fn = ctx.compile(scale, {"x": torch.zeros(2, 3)}, tmp_path / "s")
    x = torch.randn(2, 3)
    out = fn({"x": x})["y"]
    assert torch.equal(out.cpu(), x * 3)
    assert fn.input_specs["x"].location == "host"
    assert ctx.session.calls == [], "reference runs have no cycles"
    again = fn({"x": out})["y"]  # reference proxies chain too
    assert torch.allclose(again.cpu(), x * 9)
    assert torch.equal(ctx.load_codegen_dir(tmp_path / "s")({"x": x})["y"].cpu(), x * 3)


def test_a_captured_tensor_is_a_constant_of_its_value_at_compile(ctx, tmp_path):
    """An unregistered weight is a program constant. It was read when the program was loaded, at
    the first call: a host edit between compile and that call was used, a later one not, and the
    saved codegen_dir held the compile-time value. All three are the value at compile now."""
    x = torch.ones(1, 4)
    model = torch.nn.Linear(4, 1, bias=False)
    torch.nn.init.constant_(model.weight, 1.0)
    fn = ctx.compile(lambda d: {"y": model(d["x"])}, {"x": x}, tmp_path / "const")
    with torch.no_grad():
        model.weight.fill_(2.0)
    assert fn({"x": x})["y"].item() == 4.0
    with torch.no_grad():
        model.weight.fill_(3.0)
    assert fn({"x": x})["y"].item() == 4.0
    assert Context(MNDevice("mini")).load_codegen_dir(tmp_path / "const")({"x": x})["y"].item() == 4.0


def test_float64_the_function_computes_is_float32_on_the_device_with_a_warning_naming_the_line(ctx, tmp_path):
    """x.double() inside a function compiled and returned float32, silently: the device's vector
    units have no float64. It still computes in float32, but compile warns at the user's line and
    outputs keep torch's dtype (values: torch's computed in float32)."""
    x = torch.tensor([1.0, 1000.0, 3.0])

    def fn(d):
        return {"third": d["x"].double() / 3, "same": d["x"] * 2}
    with pytest.warns(UserWarning, match=r"2 op\(s\) compute in float64, which the device computes in float32 .* "
                                         r"first at .*test_compile_features.py:\d+: .*double\(\) / 3") as caught:
        compiled = ctx.compile(fn, {"x": x}, tmp_path / "double")
    assert caught[0].filename.endswith("test_compile_features.py")
    out = compiled({"x": x})
    assert out["third"].cpu().dtype == torch.float64 and out["same"].cpu().dtype == torch.float32
    torch.testing.assert_close(out["third"].cpu(), (x / 3).double())
    assert compiled.output_specs["third"].dtype == "float64"


def test_attention_under_no_grad_with_a_mask_a_parameter_computes(ctx):
    """Inference written under torch.no_grad(): attention whose float mask an embedding computes
    (T5's relative position bias). Pass 1 of the trace picks CPU flash attention there, which
    refuses a mask that requires grad: the second pass runs without autograd."""
    torch.manual_seed(0)
    table = torch.nn.Embedding(9, 2)

    def fn(d):
        with torch.no_grad():
            rel = torch.arange(5)[None, :] - torch.arange(5)[:, None] + 4
            bias = table(rel).permute(2, 0, 1)[None]
            return {"y": torch.nn.functional.scaled_dot_product_attention(d["q"], d["k"], d["v"], attn_mask=bias)}
    inputs = {k: torch.randn(1, 2, 5, 8) for k in "qkv"}
    got = ctx.compile(fn, inputs, None)(inputs)["y"].cpu()
    torch.testing.assert_close(got, fn(inputs)["y"], rtol=1e-5, atol=1e-5)
