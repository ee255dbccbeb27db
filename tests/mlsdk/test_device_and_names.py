"""MNDevice name forms, storage paths, tensor names and compile options."""

from __future__ import annotations

import gc
import os
from pathlib import Path
import warnings

import pytest
import torch

import hwdesc
from mlsdk import (MNDevice, get_tensor_name, set_buffer_name_in_optimizer, set_tensor_name,
                   set_tensor_name_in_module, storage)
from mlsdk import options as options_mod


@pytest.mark.parametrize("name, chip, index", [
    ("mncore2:auto", "mncore2", None), ("mncore2:0", "mncore2", 0), ("mncore2:7", "mncore2", 7),
    ("emu2", "mncore2", 0), ("mini:auto", "mini", None), ("mncore2_fastdram:1", "mncore2_fastdram", 1),
    ("mini", "mini", None),
])
def test_device_names_select_a_chip(name, chip, index):
    device = MNDevice(name)
    assert (device.reference, device.chip, device.index) == (False, chip, index)
    assert device.hw.name == chip


def test_a_yaml_path_selects_that_description(tmp_path):
    path = os.path.join(os.path.dirname(hwdesc.__file__), "mini.yaml")
    assert MNDevice(path).chip == "mini"
    assert MNDevice(f"{path}:auto").chip == "mini"


def test_pfvm_cpu_is_the_reference_device():
    device = MNDevice("pfvm:cpu")
    assert device.reference and device.chip == "pfvm"
    with pytest.raises(RuntimeError, match="no simulated chip"):
        device.board


@pytest.mark.parametrize("name, fragment", [
    ("mncore3:auto", "unknown device 'mncore3:auto'"),
    ("mncore2:8", "boards are numbered 0..7"),
    ("mncore2:01", "no leading zeros (mncore2:1)"),
    ("mncore2:\u0661", "unknown device"),  # an Arabic-Indic one: not a board number
    ("pfvm:cuda", "no GPU"),
    ("/nowhere/chip.yaml", "no hardware description file"),
])
def test_unknown_device_names_list_the_accepted_forms(name, fragment):
    with pytest.raises(ValueError) as err:
        MNDevice(name)
    message = str(err.value)
    assert fragment in message
    assert "'mncore2:auto'" in message and "'pfvm:cpu'" in message
    assert all(chip in message for chip in hwdesc.names())


def test_device_name_must_be_a_string():
    with pytest.raises(TypeError, match="device name string"):
        MNDevice(0)


def test_storage_path_joins_and_is_path_like(tmp_path):
    base = storage.path(str(tmp_path))
    joined = base / "step" / "x.pt"
    assert os.fspath(joined) == str(tmp_path / "step" / "x.pt")
    assert isinstance(joined, os.PathLike) and joined == str(tmp_path / "step" / "x.pt")
    os.makedirs(base / "step")
    torch.save(torch.ones(2), joined)
    assert torch.equal(torch.load(joined), torch.ones(2))
    assert joined.exists() and joined.parent == base / "step" and joined.name == "x.pt"
    assert isinstance(joined.parent, type(base)) and sorted(p.name for p in (base / "step").iterdir()) == ["x.pt"]


def test_object_store_urls_stay_urls_and_are_refused_when_used():
    """MLSDK's paths may be object-store URLs; mnsim has no store. Joining kept 's3:/bucket'
    (one slash) and a write would have made a local directory named 's3:'."""
    from mlsdk import ArgumentError
    url = storage.path("s3://bucket/run1/") / "ckpt"
    assert str(url) == "s3://bucket/run1/ckpt" and storage.path(url) == url
    with pytest.raises(ArgumentError, match="s3://bucket/run1/ckpt is an object-store URL; mnsim reads and writes "
                                            "local paths only"):
        torch.save(torch.ones(1), url)
    with pytest.raises(ArgumentError, match="storage.path takes a str or os.PathLike, not int"):
        storage.path(3)


def test_tensor_names_follow_the_tensor_object():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    set_tensor_name_in_module(model, "model")
    assert get_tensor_name(model[0].weight) == "model@0@weight"
    assert get_tensor_name(model[1].running_mean) == "model@1@running_mean"
    # names are kept by identity: an equal tensor is not named
    assert get_tensor_name(model[0].weight.detach().clone()) is None
    t = torch.zeros(3)
    set_tensor_name(t, "counter")
    assert get_tensor_name(t) == "counter"


def test_naming_and_registration_misuse_names_what_was_given():
    """Each was an AttributeError or TypeError from inside (or a number taken as a name that
    failed only at compile, in a regular expression); a module passed as an optimizer registered
    its parameters under the optimizer's prefix."""
    from mlsdk import ArgumentError, Context, MNCoreLRScheduler, MNCoreSGD, MNDevice, NameTakenError
    model = torch.nn.Linear(2, 2)
    for call, message in ((lambda: set_tensor_name(torch.zeros(1), 5), "set_tensor_name takes a str name, got int 5"),
                          (lambda: set_tensor_name(torch.zeros(1), ""), "set_tensor_name: the name is empty"),
                          (lambda: set_tensor_name([1], "x"), "set_tensor_name takes a torch.Tensor, got list"),
                          (lambda: get_tensor_name("x"), "get_tensor_name takes a torch.Tensor, got str"),
                          (lambda: set_tensor_name_in_module(torch.zeros(1), "m"), "takes an nn.Module, got Tensor"),
                          (lambda: set_buffer_name_in_optimizer(model, "o"), "takes a torch optimizer, got Linear"),
                          (lambda: Context.switch_context("x"), "switch_context takes a Context \\(or None\\), got str"),
                          (lambda: MNCoreLRScheduler(torch.optim.lr_scheduler.StepLR(MNCoreSGD(model.parameters(),
                                                                                                0.1), 1), None),
                           "context must be the mlsdk Context")):
        with pytest.raises(ArgumentError, match=message):
            call()
    ctx = Context(MNDevice("mini"))
    with pytest.raises(ArgumentError, match="register_optimizer_buffers takes an optimizer, got Linear"):
        ctx.register_optimizer_buffers(model)
    assert get_tensor_name(model.weight) is None
    ctx.register_optimizer_buffers(MNCoreSGD(torch.nn.Linear(2, 2).parameters(), 0.1, 0.9))
    with pytest.raises(NameTakenError, match=r"already registered as 'optimizer@0@momentum_buffer'.*"
                                                r"set_buffer_name_in_optimizer\(optimizer, prefix\)"):
        ctx.register_optimizer_buffers(MNCoreSGD(torch.nn.Linear(2, 2).parameters(), 0.1, 0.9))
    second = MNCoreSGD(torch.nn.Linear(2, 2).parameters(), 0.1, 0.9)
    set_buffer_name_in_optimizer(second, "second")
    ctx.register_optimizer_buffers(second)


def test_optimizer_buffers_are_named_by_parameter_index():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    set_buffer_name_in_optimizer(opt, "optim0")
    names = sorted(get_tensor_name(s["momentum_buffer"]) for s in opt.state.values())
    assert names == ["optim0@0@momentum_buffer", "optim0@1@momentum_buffer"]


def test_options_unknown_keys_warn_and_list_the_known_ones():
    with pytest.warns(UserWarning, match=r"unknown compile option\(s\) 'fast_math'.*known options: float_dtype"):
        assert options_mod.check({"fast_math": True}) == {"float_dtype": "float"}


def test_options_documented_keys_are_accepted_silently():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checked = options_mod.check({"float_dtype": "mixed", "option_json": "O1.json", "envs": {}, "scheduler": "x",
                                     "layout_spec": "a.json", "gemm_layout_spec": "b.json"})
    assert checked == {"float_dtype": "mixed"}


def test_options_bad_float_dtype_raises():
    with pytest.raises(ValueError, match="float_dtype.*'double'.*float, mixed"):
        options_mod.check({"float_dtype": "double"})


@pytest.mark.parametrize("options", ["mixed", ["float_dtype"], 3])
def test_options_that_are_not_a_dict_are_refused_naming_what_was_given(options):
    """options="mixed" (the value without its key) crashed inside compile with an AttributeError."""
    from mlsdk import Context, MNDevice, OptionError
    ctx = Context(MNDevice("mini"))
    with pytest.raises(OptionError, match=rf"options must be a dict such as .*, not {type(options).__name__} "):
        ctx.compile(lambda d: {"y": d["x"] + 1}, {"x": torch.ones(3)}, None, options=options)
    assert ctx.compile(lambda d: {"y": d["x"] + 1}, {"x": torch.ones(3)}, None)({"x": torch.ones(3)})["y"].cpu()[0] == 2


def test_compile_arguments_of_the_wrong_type_are_refused_and_the_context_stays_usable():
    """cache_options as a path string and codegen_dir as a number failed inside (an AttributeError,
    os.fspath's TypeError); training="yes" was taken as true; a compiled function called while
    another is traced failed on .numpy() of a fake tensor. Each is an ArgumentError naming it."""
    from mlsdk import ArgumentError, Context, MNDevice
    from compiler.errors import CompileError
    ctx = Context(MNDevice("mini"))
    fn, x = (lambda d: {"y": d["x"] * 2}), torch.ones(3)
    for kwargs, message in ((dict(cache_options="/tmp/cache"), "cache_options must be an mlsdk.CacheOptions"),
                            (dict(codegen_dir=123), "codegen_dir must be a path"),
                            (dict(training="yes"), "training must be True, False or None, not str 'yes'"),
                            (dict(io_spec_constraints=[1]), "io_spec_constraints must be a dict of input or output "
                                                            "name -> IOSpec"),
                            (dict(function=5), "compile takes a function \\(or nn.Module\\) to compile, not int 5")):
        kwargs.setdefault("codegen_dir", None)
        with pytest.raises(ArgumentError, match=message):
            ctx.compile(kwargs.pop("function", fn), {"x": x}, **kwargs)
    doubled = ctx.compile(fn, {"x": x}, None)
    with pytest.raises(CompileError, match=r"is called inside a function being compiled.*\n  at .*test_device_and_names"):
        ctx.compile(lambda d: {"z": doubled({"x": d["x"]})["y"] + 1}, {"x": x}, None)
    assert doubled({"x": x})["y"].cpu().tolist() == [2.0, 2.0, 2.0]


def test_readme_documents_every_option():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    missing = [name for name in [*options_mod.USED, *options_mod.IGNORED] if f"`{name}`" not in readme]
    assert not missing, f"README does not say what mnsim does with: {missing}"


def test_a_dropped_context_is_collected():
    """The gather cache kept a failed match's exception with its traceback, whose frames held the
    compiling Context (and through it the registered modules and device buffers) for as long as
    the cache lived."""
    import gc
    import weakref
    from mlsdk import Context, MNDevice
    ctx = Context(MNDevice("mini"))
    model = torch.nn.Linear(64, 64)
    ctx.registry.register("m", model)
    x = torch.randn(8, 64)
    fn = ctx.compile(lambda d: {"y": model(d["x"])}, {"x": x}, None)
    fn({"x": x})["y"].cpu()
    dropped = weakref.ref(ctx)
    del ctx, fn
    gc.collect()
    assert dropped() is None


def test_a_dropped_context_returns_its_device_memory():
    """Contexts dropped without invalidate() on one device kept their buffers: the 16th with 4 MiB
    of weights on mini (64 MiB of DRAM) failed with DeviceMemoryError. A buffer nothing holds
    gives its region back at the next allocation (collecting reference cycles first when memory
    runs out); a function kept after its Context keeps what it uses and still runs."""
    from mlsdk import Context, MNDevice
    device = MNDevice("mini")
    x = torch.randn(8, 1024)
    for _ in range(20):
        ctx = Context(device)
        model = torch.nn.Linear(1024, 1024)
        ctx.registry.register("m", model)
        fn = ctx.compile(lambda d: {"y": model(d["x"])}, {"x": x}, None)
        torch.testing.assert_close(fn({"x": x})["y"].cpu(), model(x).detach(), rtol=1e-5, atol=1e-5)
    board = ctx.device.board
    kept, expected = fn, model(x).detach()
    del ctx, fn
    held = board.allocated_lw()
    torch.testing.assert_close(kept({"x": x})["y"].cpu(), expected, rtol=1e-5, atol=1e-5)
    assert board.allocated_lw() == held
    del kept
    gc.collect()
    assert board.allocated_lw() == 0
