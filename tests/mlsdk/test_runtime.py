"""Context, CompiledFunction and TensorProxy on the simulated `mini` chip: values against torch,
how each input is bound (upload, relocation, conversion) and what it costs."""

from __future__ import annotations

import copy
import io

import pytest
import torch

from compiler.errors import CompileError
import mlsdk
from mlsdk import CompiledFunction, Context, IOSpec, MNDevice, TensorProxy, storage
from mlsdk.errors import InputError

Dict = dict[str, torch.Tensor]


def producer(d: Dict) -> Dict:
    return {"shared": d["x"] * 2}


def consumer(d: Dict) -> Dict:
    return {"result": d["shared"] + 1}


def scores(d: Dict) -> Dict:
    return {"scores": d["q"] @ d["k"].T}


def softmax_rows(d: Dict) -> Dict:
    return {"probs": torch.softmax(d["scores"], dim=-1)}


@pytest.fixture
def ctx() -> Context:
    return Context(MNDevice("mini:auto"))


def test_compile_and_call_match_torch(ctx, tmp_path):
    x = torch.randn(32, 64)
    fn = ctx.compile(producer, {"x": x}, storage.path(str(tmp_path)) / "p", options={"float_dtype": "float"},
                     training=False, export_kwargs={"use_fx2onnx": True}, num_compiler_threads=-1, quiet=True)
    assert isinstance(fn, CompiledFunction)
    assert set(fn.input_specs) == {"x"} and set(fn.output_specs) == {"shared"}
    spec = fn.input_specs["x"]
    assert isinstance(spec, IOSpec) and spec.shape == (32, 64) and spec.dtype == "float32" and spec.location == "DRAM"
    out = fn({"x": x})
    assert isinstance(out["shared"], TensorProxy)
    assert torch.equal(out["shared"].cpu(), x * 2)
    assert (tmp_path / "p" / "manifest.json").exists()
    call = ctx.session.calls[-1]
    assert call.function == "producer" and call.stats.total_cycles > 0
    assert [(b.input, b.path) for b in call.bindings] == [("x", "upload")]
    assert call.bindings[0].cycles > 0 and call.bindings[0].bytes == spec.size_bytes


def test_switch_context_makes_a_context_current(ctx):
    other = Context(MNDevice("mini:0"))
    Context.switch_context(ctx)
    assert Context.current() is ctx
    Context.switch_context(other)
    assert Context.current() is other


def test_constrained_chain_relocates(ctx, tmp_path):
    sample = torch.randn(32, 64)
    c = ctx.compile(consumer, {"shared": sample}, tmp_path / "c")
    p = ctx.compile(producer, {"x": sample}, tmp_path / "p", io_spec_constraints={"shared": c.input_specs["shared"]})
    assert p.output_specs["shared"].is_memcopyable_to(c.input_specs["shared"])
    mid = p({"x": sample})
    result = c(mid)["result"].cpu()
    assert torch.allclose(result, sample * 2 + 1)
    binding = ctx.session.calls[-1].bindings[0]
    assert (binding.path, binding.cycles, binding.bytes, binding.producer) == ("relocation", 0, 0, "producer.shared")
    assert len(ctx.runtime.conversions) == 0, "a relocation must not build a conversion program"
    assert binding.handover.constrained and binding.handover.as_run == binding.handover.with_constraint


def test_unconstrained_chain_converts_with_the_same_values(ctx, tmp_path):
    q, k = torch.randn(16, 8), torch.randn(32, 8)
    p = ctx.compile(scores, {"q": q, "k": k}, tmp_path / "p")
    c = ctx.compile(softmax_rows, {"scores": q @ k.T}, tmp_path / "c")
    assert not p.output_specs["scores"].is_memcopyable_to(c.input_specs["scores"])
    expected = torch.softmax(q @ k.T, dim=-1)
    for _ in range(2):
        probs = c(p({"q": q, "k": k}))["probs"].cpu()
        assert torch.allclose(probs, expected, atol=1e-5)
    conversions = [b for b in ctx.session.bindings if b.path == "conversion"]
    assert len(conversions) == 2 and all(b.cycles > 0 for b in conversions)
    assert conversions[0].cycles == conversions[1].cycles
    h = conversions[0].handover
    producer_call = ctx.session.calls[0]
    assert h.as_run == h.without_constraint == producer_call.cycles_with_bindings + conversions[0].cycles
    assert h.host_round_trip > producer_call.cycles_with_bindings and not h.constrained
    assert (h.advice is not None) == (h.saved > 0)
    if h.advice:
        assert f"io_spec_constraints={{'scores': softmax_rows.input_specs['scores']}} to relocate instead and save " \
               f"{h.saved} cycles" in h.advice
    assert len(ctx.runtime.conversions) == 1, "the conversion program is built once per spec pair"


def test_mixed_tensors_and_proxies(ctx, tmp_path):
    def add(d: Dict) -> Dict:
        return {"out": d["a"] + d["b"]}
    a, b = torch.randn(8, 16), torch.randn(8, 16)
    fn = ctx.compile(add, {"a": a, "b": b}, tmp_path / "add")
    first = fn({"a": a, "b": b})["out"]
    second = fn({"a": first, "b": b})["out"]  # a proxy (relocated) and a tensor (uploaded)
    assert torch.allclose(second.cpu(), a + 2 * b, atol=1e-6)
    assert [b.path for b in ctx.session.calls[-1].bindings] == ["relocation", "upload"]


def test_allocate_input_proxy_and_load_from(ctx, tmp_path):
    fn = ctx.compile(consumer, {"shared": torch.zeros(4, 8)}, tmp_path / "c")
    proxies = fn.allocate_input_proxy()
    assert set(proxies) == {"shared"} and proxies["shared"].shape == torch.Size([4, 8])
    proxies["shared"].load_from(torch.full((4, 8), 5.0), clone=False)
    assert torch.equal(fn(proxies)["result"].cpu(), torch.full((4, 8), 6.0))
    assert ctx.session.calls[-1].bindings[0].path == "relocation"
    proxies["shared"].load_from(fn(proxies)["result"])  # from another proxy
    assert torch.equal(proxies["shared"].cpu(), torch.full((4, 8), 6.0))
    with pytest.raises(InputError, match=r"source has shape \[2\], this proxy \[4, 8\]"):
        proxies["shared"].load_from(torch.zeros(2))


def test_tensor_proxy_behaves_like_its_host_value(ctx, tmp_path):
    fn = ctx.compile(producer, {"x": torch.zeros(2, 3)}, tmp_path / "p")
    x = torch.arange(6.0).reshape(2, 3)
    proxy = fn({"x": x})["shared"]
    host = x * 2
    assert proxy.shape == (2, 3) and proxy.dtype == torch.float32 and proxy.ndim == 2 and proxy.numel() == 6
    assert torch.equal(torch.cat([proxy, proxy]), torch.cat([host, host]))
    assert torch.equal(proxy + 1, host + 1) and torch.equal(1 - proxy, 1 - host)
    assert [torch.equal(a, b) for a, b in zip(proxy.split(1, dim=0), host.split(1, dim=0))] == [True, True]
    assert torch.equal(proxy[1], host[1]) and torch.equal(proxy.sum(), host.sum())
    assert proxy[1, 2].item() == 10.0
    with pytest.raises(AttributeError, match="no 'device' attribute"):
        proxy.device
    downloads = [t for t in ctx.session.transfers if t.kind == "download"]
    assert len(downloads) == 1 and downloads[0].stats.total_cycles > 0, "cpu() downloads once and counts it"


def test_tensor_proxy_operators_format_and_copies(ctx, tmp_path):
    """Every Python operator a tensor has; `f"{loss:.4f}"` as training loops print; pickles and
    deep copies are host tensors of the value."""
    fn = ctx.compile(lambda d: {"f": d["x"] * 2, "i": (d["x"] * 3).to(torch.int32)}, {"x": torch.zeros(4)},
                     tmp_path / "ops")
    x = torch.arange(4.0)
    out = fn({"x": x})
    f, i = out["f"], out["i"]
    hf, hi = x * 2, (x * 3).to(torch.int32)
    for got, want in ((f // 3, hf // 3), (7 // (f + 1), 7 // (hf + 1)), (f % 3, hf % 3), (5 % (f + 1), 5 % (hf + 1)),
                      (2 ** f, 2 ** hf), (f ** 2, hf ** 2), (i & 5, hi & 5), (5 & i, 5 & hi), (i | 8, hi | 8),
                      (i ^ 3, hi ^ 3), (~i, ~hi), (i << 2, hi << 2), (i >> 1, hi >> 1), (+f, hf), (-f, -hf)):
        assert torch.equal(got, want)
    assert f"{f.sum():.3f}" == "12.000" and f"{f[3]:.1f}" == "6.0"
    assert isinstance(copy.deepcopy(f), torch.Tensor) and torch.equal(copy.deepcopy({"f": f})["f"], hf)
    buf = io.BytesIO()
    torch.save({"f": f}, buf)
    buf.seek(0)
    assert torch.equal(torch.load(buf)["f"], hf)


def test_tensor_proxy_in_place_changes_write_through(ctx, tmp_path):
    """`add_`, `p[i] = v` and `p += v` change the proxy's value (uploaded), not a downloaded copy:
    the next cpu() and the next call that reads the proxy see the change."""
    fn = ctx.compile(producer, {"x": torch.zeros(4)}, tmp_path / "p")
    proxy = fn({"x": torch.arange(4.0)})["shared"]  # 0, 2, 4, 6
    assert proxy.add_(1) is proxy
    proxy[0] = 100.0
    alias = proxy
    proxy += 1
    proxy.mul_(torch.tensor(2.0))
    assert alias is proxy and isinstance(proxy, TensorProxy)
    assert torch.equal(proxy.cpu(), torch.tensor([202.0, 8.0, 12.0, 16.0]))
    assert torch.equal(fn({"x": proxy})["shared"].cpu(), torch.tensor([404.0, 16.0, 24.0, 32.0]))
    uploads = [t for t in ctx.session.transfers if t.kind == "upload"]
    assert len(uploads) >= 4, "each in-place change is an upload the report counts"


def test_a_tensor_from_cpu_is_the_callers_to_change(ctx, tmp_path):
    """cpu() hands out its first download as it is; changing it changes no later read of the
    proxy, and the report still counts one download."""
    fn = ctx.compile(producer, {"x": torch.zeros(4, 8)}, tmp_path / "p")
    x = torch.randn(4, 8)
    proxy = fn({"x": x})["shared"]
    first = proxy.cpu()
    first += 100
    second = proxy.cpu()
    assert torch.equal(second, x * 2)
    second -= 7
    assert torch.equal(proxy.cpu(), x * 2) and (proxy.numpy() == (x * 2).numpy()).all()
    downloads = [t for t in ctx.session.transfers if t.kind == "download"]
    assert len(downloads) == 1
    fresh = fn({"x": x + 1})["shared"]  # a new value: downloaded and counted again
    assert torch.equal(fresh.cpu(), (x + 1) * 2)
    assert len([t for t in ctx.session.transfers if t.kind == "download"]) == 2


def test_registered_module_stays_on_the_device(ctx, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    ctx.registry.register("model", model)
    fn = ctx.compile(lambda d: {"y": model(d["x"])}, {"x": torch.zeros(2, 8)}, tmp_path / "m")
    assert set(fn.input_specs) == {"x"}, "registered parameters are not call inputs"
    x = torch.randn(2, 8)
    for _ in range(2):
        assert torch.allclose(fn({"x": x})["y"].cpu(), model(x).detach(), atol=1e-5)
    uploads = [t.what for t in ctx.session.transfers if t.kind == "upload"]
    assert sorted(uploads) == ["registered model@bias", "registered model@weight"], "weights upload once"
    paths = {b.input: b.path for b in ctx.session.calls[-1].bindings}
    assert paths == {"x": "upload", "model@weight": "relocation", "model@bias": "relocation"}


def test_registered_value_proxy_load_from_and_synchronize(ctx, tmp_path):
    model = torch.nn.Linear(4, 4, bias=False)
    torch.nn.init.constant_(model.weight, 1.0)
    from mlsdk import set_tensor_name_in_module
    set_tensor_name_in_module(model, "lin")
    ctx.register_param(model.weight)
    fn = ctx.compile(lambda d: {"y": model(d["x"])}, {"x": torch.ones(2, 4)}, tmp_path / "m")
    proxy = ctx.get_registered_value_proxy(model.weight)
    assert torch.equal(proxy.cpu(), torch.ones(4, 4))
    proxy.load_from(torch.full((4, 4), 3.0))
    assert torch.equal(fn({"x": torch.ones(2, 4)})["y"].cpu(), torch.full((2, 4), 12.0))
    assert torch.equal(model.weight.detach(), torch.ones(4, 4)), "the host copy changes only at synchronize"
    ctx.synchronize()
    assert torch.equal(model.weight.detach(), torch.full((4, 4), 3.0))


def test_registration_errors(ctx):
    with pytest.raises(Exception, match="name a tensor before registering"):
        ctx.register_param(torch.nn.Parameter(torch.zeros(2)))
    from mlsdk import set_tensor_name
    a, b = torch.zeros(2), torch.zeros(2)
    set_tensor_name(a, "w")
    set_tensor_name(b, "w")
    ctx.register_buffer(a)
    with pytest.raises(mlsdk.NameTakenError, match="already registered as 'w'") as taken:
        ctx.register_buffer(b)
    assert isinstance(taken.value, mlsdk.RegistrationError)
    with pytest.raises(Exception, match="not registered"):
        ctx.get_registered_value_proxy(torch.zeros(1))
    with pytest.raises(TypeError, match="nn.Module or an optimizer"):
        ctx.registry.register("x", 3)


def test_two_models_in_one_context_keep_their_weights_apart(ctx, tmp_path):
    models = {}
    for prefix, value in (("m0", 1.0), ("m1", 2.0)):
        m = torch.nn.Linear(4, 4, bias=False)
        torch.nn.init.constant_(m.weight, value)
        ctx.registry.register(prefix, m)
        models[prefix] = m
    f0 = ctx.compile(lambda d: {"y": models["m0"](d["x"])}, {"x": torch.ones(1, 4)}, tmp_path / "0")
    f1 = ctx.compile(lambda d: {"y": models["m1"](d["x"])}, {"x": torch.ones(1, 4)}, tmp_path / "1")
    assert torch.equal(f0({"x": torch.ones(1, 4)})["y"].cpu(), torch.full((1, 4), 4.0))
    assert torch.equal(f1({"x": torch.ones(1, 4)})["y"].cpu(), torch.full((1, 4), 8.0))


def test_input_errors_name_the_key_and_leave_the_context_usable(ctx, tmp_path):
    fn = ctx.compile(producer, {"x": torch.zeros(4, 8)}, tmp_path / "p")
    with pytest.raises(InputError, match=r"producer \(Context #\d+ on mini:auto\): missing 'x'; it takes 'x'"):
        fn({})
    with pytest.raises(InputError, match=r"unexpected 'y'"):
        fn({"x": torch.zeros(4, 8), "y": torch.zeros(1)})
    with pytest.raises(InputError, match=r"input 'x' is float32\[4, 9\]; expected float32\[4, 8\] \(IOSpec\(x: "):
        fn({"x": torch.zeros(4, 9)})
    with pytest.raises(InputError, match=r"input 'x' is float16\[4, 8\]; expected float32\[4, 8\]"):
        fn({"x": torch.zeros(4, 8, dtype=torch.float16)})
    with pytest.raises(InputError, match=r"input 'x' is a float; expected a tensor or a TensorProxy"):
        fn({"x": 1.0})
    with pytest.raises(InputError, match=r"missing 'x'; unexpected 'x.0'"):
        fn({"x": [torch.zeros(4, 8)]})
    assert isinstance(InputError("x"), ValueError)
    assert torch.equal(fn({"x": torch.ones(4, 8)})["shared"].cpu(), torch.full((4, 8), 2.0))


def test_invalidate_stops_proxies_and_functions(ctx, tmp_path):
    from mlsdk.errors import InvalidatedError
    fn = ctx.compile(producer, {"x": torch.zeros(2, 2)}, tmp_path / "p")
    proxy = fn({"x": torch.ones(2, 2)})["shared"]
    board = ctx.device.board
    ctx.invalidate()
    assert board.allocated_lw() == 0, "invalidate releases every device buffer"
    for action in (proxy.cpu, lambda: fn({"x": torch.ones(2, 2)}),
                   lambda: ctx.compile(producer, {"x": torch.zeros(2, 2)}, tmp_path / "q")):
        with pytest.raises(InvalidatedError, match="invalidated"):
            action()
    fresh = Context(ctx.device)  # the device itself stays usable
    again = fresh.compile(producer, {"x": torch.zeros(2, 2)}, tmp_path / "r")
    assert torch.equal(again({"x": torch.ones(2, 2)})["shared"].cpu(), torch.full((2, 2), 2.0))


def test_proxy_from_another_device_is_refused(ctx, tmp_path):
    other = Context(MNDevice("mini:1"))
    p = other.compile(producer, {"x": torch.zeros(2, 2)}, tmp_path / "p")
    c = ctx.compile(consumer, {"shared": torch.zeros(2, 2)}, tmp_path / "c")
    with pytest.raises(InputError, match=r"proxy \(producer.shared\) of Context #\d+ on mini:1, whose device is not "
                                         r"this one \(Context #\d+ on mini:auto\)"):
        c(p({"x": torch.ones(2, 2)}))


def test_allocated_input_proxies_are_freed(ctx, tmp_path):
    import gc
    fn = ctx.compile(consumer, {"shared": torch.zeros(4, 8)}, tmp_path / "c")
    board = ctx.device.board
    fn({"shared": torch.zeros(4, 8)})  # loads the program
    gc.collect()
    held = board.allocated_lw()
    for _ in range(3):
        proxies = fn.allocate_input_proxy()
        proxies["shared"].load_from(torch.ones(4, 8))
        fn(proxies)
        del proxies
        gc.collect()
    assert board.allocated_lw() == held
    kept = fn.allocate_input_proxy()
    ctx.invalidate()
    assert board.allocated_lw() == 0 and kept["shared"].device_value.buffer.freed


@pytest.mark.parametrize("device", ["mini:auto", "pfvm:cpu"])
def test_every_handle_of_a_registered_tensor_sees_a_write(device, tmp_path):
    ctx = Context(MNDevice(device))
    model = torch.nn.Linear(4, 4, bias=False)
    torch.nn.init.constant_(model.weight, 1.0)
    ctx.registry.register("m", model)
    fn = ctx.compile(lambda d: {"y": model(d["x"])}, {"x": torch.ones(1, 4)}, tmp_path / "m")
    p, q = ctx.get_registered_value_proxy(model.weight), ctx.get_registered_value_proxy(model.weight)
    assert torch.equal(p.cpu(), torch.ones(4, 4))
    q.load_from(torch.full((4, 4), 5.0))
    assert torch.equal(p.cpu(), torch.full((4, 4), 5.0))
    assert torch.equal(fn({"x": torch.ones(1, 4)})["y"].cpu(), torch.full((1, 4), 20.0))


def test_two_layouts_of_a_registered_weight_are_converted_once(ctx, tmp_path):
    model = torch.nn.Linear(8, 8, bias=False)
    ctx.registry.register("m", model)
    w = model.weight
    fa = ctx.compile(lambda d: {"y": d["x"] @ w.t()}, {"x": torch.zeros(8, 8)}, tmp_path / "a")
    fb = ctx.compile(lambda d: {"y": d["x"] + w}, {"x": torch.zeros(8, 8)}, tmp_path / "b")
    x = torch.randn(8, 8)
    for _ in range(3):
        assert torch.allclose(fa({"x": x})["y"].cpu(), x @ w.detach().t(), atol=1e-5)
        assert torch.allclose(fb({"x": x})["y"].cpu(), x + w.detach())
    paths = [b.path for b in ctx.session.bindings if b.input == "m@weight"]
    assert paths.count("relocation") >= 4 and len(paths) - paths.count("relocation") <= 1, paths
    uploads = [r.what for r in ctx.session.transfers if r.kind == "upload"]
    assert uploads == ["registered m@weight"]


def test_optimizer_buffer_names_survive_registration(ctx):
    from mlsdk import get_tensor_name, set_buffer_name_in_optimizer
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam([a, b])
    b.grad = torch.ones(2)
    opt.step()  # only b has state
    set_buffer_name_in_optimizer(opt, "opt")
    ctx.register_optimizer_buffers(opt)
    assert sorted(get_tensor_name(t) for t in opt.state[b].values()) == ["opt@1@exp_avg", "opt@1@exp_avg_sq",
                                                                          "opt@1@step"]


def test_invalidating_a_reference_context_clears_the_current_one():
    ctx = Context(MNDevice("pfvm:cpu"))
    Context.switch_context(ctx)
    ctx.invalidate()
    assert Context.current() is None


def test_conversions_do_not_depend_on_io_names(ctx, tmp_path):
    q, k = torch.randn(16, 8), torch.randn(32, 8)
    p1 = ctx.compile(scores, {"q": q, "k": k}, None)
    c1 = ctx.compile(softmax_rows, {"scores": q @ k.T}, None)

    def renamed(d):
        return {"s2": torch.softmax(d["s2"], dim=-1)}
    c2 = ctx.compile(renamed, {"s2": q @ k.T}, None)
    s = p1({"q": q, "k": k})["scores"]
    c1({"scores": s})
    c2({"s2": s})
    assert len(ctx.runtime.conversions) == 1


def test_advice_is_given_only_for_function_outputs(ctx, tmp_path):
    q, k = torch.randn(16, 8), torch.randn(32, 8)
    c = ctx.compile(softmax_rows, {"scores": q @ k.T}, None)
    p = ctx.compile(scores, {"q": q, "k": k}, None)
    c(p({"q": q, "k": k}))
    produced = ctx.session.calls[-1].bindings[0]
    assert produced.handover is not None and (produced.advice is not None) == (produced.handover.saved > 0)
    other = ctx.compile(lambda d: {"y": d["s"] @ k}, {"s": q @ k.T}, None)  # reads s as a product's A
    proxies = other.allocate_input_proxy()
    proxies["s"].load_from(q @ k.T)
    assert not proxies["s"].spec.is_memcopyable_to(c.input_specs["scores"])
    c({"scores": proxies["s"]})
    binding = ctx.session.calls[-1].bindings[0]
    assert binding.path == "conversion" and binding.handover is None, "an allocated buffer is no function's output"


def image_arithmetic(d: Dict) -> Dict:
    """What a function may do with a uint8 image besides converting it: uint8 arithmetic wraps at
    256 in torch (255 + 1 is 0), movement keeps the values, casts widen them."""
    x = d["image"]
    return {"scaled": x.float() / 255.0, "inc": x + 1, "neg": -x, "mul": x * 3, "not": ~x, "shl": x << 3,
            "hwc": x.permute(0, 2, 3, 1), "max": x.amax(1), "as_int": x.int(), "as_long": x.long(),
            "total": x.sum(), "same": x, "where": torch.where(x > 128, x, -1).float()}


def test_a_uint8_image_is_taken_as_int32_and_computes_as_torch(ctx, tmp_path):
    """PFN's ssd_inference.py feeds a uint8 image and divides `.float()` of it by 255 inside the
    compiled function; the device holds it as int32, and outputs keep torch's dtypes and values."""
    image = torch.randint(0, 256, (1, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    image.view(-1)[:4] = torch.tensor([0, 1, 254, 255], dtype=torch.uint8)
    fn = ctx.compile(image_arithmetic, {"image": image}, None)
    assert fn.input_specs["image"].dtype == "uint8"
    got, want = fn({"image": image}), image_arithmetic({"image": image})
    for name, expected in want.items():
        out = got[name].cpu()
        assert out.dtype == expected.dtype and torch.equal(out, expected), name
        assert fn.output_specs[name].dtype == str(expected.dtype).replace("torch.", ""), name
    with pytest.raises(InputError, match=r"input 'image' is int32\[1, 3, 8, 8\]; expected uint8\[1, 3, 8, 8\]"):
        fn({"image": image.int()})
    again = torch.full_like(image, 255)
    assert torch.equal(fn({"image": again})["inc"].cpu(), torch.zeros_like(image))


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16])
def test_signed_narrow_integers_wrap_as_torch(ctx, dtype):
    """int8 and int16 wrap at their own width in torch (-(-128) is -128 in int8); held as int32
    they are folded back after every op that may leave their range."""
    info = torch.iinfo(dtype)
    x = torch.randint(info.min, info.max + 1, (4, 33), dtype=dtype, generator=torch.Generator().manual_seed(1))
    x.view(-1)[:4] = torch.tensor([info.min, info.max, -1, 0], dtype=dtype)

    def fn(d: Dict) -> Dict:
        x = d["x"]
        return {"add": x + 100, "neg": -x, "abs": x.abs(), "square": x * x, "half": x.float() * 0.5,
                "div": x // 3, "wide": x.int() * 1000}
    compiled = ctx.compile(fn, {"x": x}, None)
    got = compiled({"x": x})
    for name, expected in fn({"x": x}).items():
        out = got[name].cpu()
        assert out.dtype == expected.dtype and torch.equal(out, expected), name


def test_a_narrow_output_feeds_another_function_as_a_proxy(ctx):
    image = torch.randint(0, 256, (8, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    brighten = ctx.compile(lambda d: {"image": d["image"] + 100}, {"image": image}, None)
    normalize = ctx.compile(lambda d: {"x": d["image"].float() / 255.0}, {"image": image}, None)
    out = normalize(brighten({"image": image}))["x"].cpu()
    assert torch.equal(out, (image + 100).float() / 255.0)


def test_an_int32_input_returned_as_int64_keeps_the_input_int32(ctx):
    """`x.long()` of an int32 input is the input's own device value: the output is int64 and the
    input stays int32 (marking the shared value int64 made the input spec int64 too)."""
    x = torch.arange(-4, 4, dtype=torch.int32)
    fn = ctx.compile(lambda d: {"wide": d["x"].long(), "same": d["x"]}, {"x": x}, None)
    assert fn.input_specs["x"].dtype == "int32" and fn.output_specs["wide"].dtype == "int64"
    got = fn({"x": x})
    assert got["wide"].cpu().dtype == torch.int64 and torch.equal(got["wide"].cpu(), x.long())
    assert got["same"].cpu().dtype == torch.int32 and torch.equal(got["same"].cpu(), x)



def test_compiling_one_function_after_another_unloads_the_least_recently_called(tmp_path):
    """Each loaded program holds its constants and temporaries in DRAM. A Context that compiles one
    function after another (a shape sweep, a notebook cell run again) fills the device: when a
    call finds no room, the program called least recently is unloaded, and loads again (its
    constants uploaded anew) when it is called next. Every call computes right values. (mini
    with 4 MiB of DRAM a Group, so that a few programs fill it.)"""
    chip = tmp_path / "mini_small_dram.yaml"
    chip.write_text("extends: mini\nname: mini_small_dram\nsummary: mini with 4 MiB of DRAM a Group\n"
                    "memories:\n  DRAM: {capacity_bytes: 4 MiB}\n")
    ctx = Context(MNDevice(str(chip)))
    torch.manual_seed(0)
    layer = torch.nn.Linear(128, 128)
    functions, inputs = [], []
    for i in range(6):
        x = torch.randn(1024 + 64 * i, 128)  # a new shape: a new program
        fn = ctx.compile(lambda d: {"y": torch.relu(layer(d["x"]))}, {"x": x}, None)
        with torch.no_grad():
            assert torch.allclose(fn({"x": x})["y"].cpu(), torch.relu(layer(x)), atol=1e-4)
        functions.append(fn)
        inputs.append(x)
    loaded = [e for e in ctx.runtime.executables if e.loaded is not None]
    assert 0 < len(loaded) < len(functions) and ctx.runtime.executables[0].loaded is None  # the earliest went
    with torch.no_grad():  # the first loads again
        assert torch.allclose(functions[0]({"x": inputs[0]})["y"].cpu(), torch.relu(layer(inputs[0])), atol=1e-4)
    assert ctx.runtime.executables[0].loaded is not None
