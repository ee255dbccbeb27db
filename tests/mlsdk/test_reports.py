"""Reports (text, JSON, CSV, PNG) and the run / report / compare commands."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mlsdk import Context, MNCoreSGD, MNDevice, set_tensor_name_in_module
from mlsdk.cli import main
from mlsdk.report import Report, build, op_cycles

from .test_training import registered

REPO = Path(__file__).resolve().parents[2]
SEED = str(REPO / "examples" / "io_spec_constraints.py")
CHAIN = str(REPO / "examples" / "chain_conversion.py")


def scale(d):
    return {"y": d["x"] * 3 + 1}


@pytest.fixture
def session_report(tmp_path):
    ctx = Context(MNDevice("mini:auto"))
    fn = ctx.compile(scale, {"x": torch.zeros(8, 16)}, tmp_path / "s")
    mid = fn({"x": torch.ones(8, 16)})["y"]
    fn({"x": mid})["y"].cpu()
    return ctx, build([ctx.session], "test")


def test_report_totals_are_the_runs(session_report):
    ctx, report = session_report
    assert [r.kind for r in report.runs] == ["binding", "call", "call", "download"]
    assert report.total_cycles == sum(r.cycles for r in report.runs) == ctx.session.total_cycles()
    assert [r.start_cycle for r in report.runs] == list(np.cumsum([0] + [r.cycles for r in report.runs[:-1]]))
    assert report.time_us == pytest.approx(report.total_cycles / report.clock_hz * 1e6)
    busy = {u.unit: u.busy_cycles for u in report.units}
    assert busy["PE stream"] == sum(r.stats.pe_busy for r in ctx.session.runs)
    assert busy["host link"] == sum(r.stats.host_busy for r in ctx.session.runs) > 0
    for u in report.units:
        assert u.utilisation == pytest.approx(u.busy_cycles / report.total_cycles)
    assert report.paths["host_to_pdm"] == sum(r.stats.bytes_per_path.get("host_to_pdm", 0) for r in ctx.session.runs)


def test_ops_add_up_to_their_calls(session_report):
    ctx, report = session_report
    call_cycles = sum(c.stats.total_cycles for c in ctx.session.calls)
    assert sum(o.cycles for o in report.ops) == call_cycles
    assert all(o.calls == 2 and o.function == "scale" for o in report.ops)
    assert any("@ test_reports.py:" in o.op for o in report.ops), "ops name the user's source line"


def test_op_cycles_attribute_the_frontier():
    class Stats:
        start = np.array([0, 5, 10, 12])
        end = np.array([10, 8, 30, 20])
        total_cycles = 34

        def span(self, a, b):
            return int(self.end[a:b].max() - self.start[a:b].min())
    rows = op_cycles(Stats(), [(0, 2, "a"), (2, 3, "b")])
    # a ends at 10; b pushes the end to 30; instruction 3 ends inside; the tail 30..34 is (other)
    assert rows == [("a", 10, 10), ("b", 20, 20), ("(other)", 4, 8)]


def test_relocation_savings_in_the_report(session_report):
    _, report = session_report
    (relocated,) = report.relocations()
    assert relocated.consumer == "scale.x" and relocated.producer == "scale.y" and relocated.cycles == 0
    (h,) = report.handovers
    # the same function's output read by itself: the layouts match, a constraint changes nothing
    assert (h.producer, h.consumers, h.calls) == ("scale.y", ["scale.x"], 1)
    assert h.as_run == h.with_constraint == h.without_constraint and h.saved == 0
    assert h.note == "the layouts match without a constraint" and h.advice is None
    assert h.saved_vs_host == h.host_round_trip - h.as_run > 0
    (chain,) = report.chains
    assert chain.functions == ["scale"] and chain.calls == 2 and chain.saved == 0


def test_timeline_fractions_match_busy_cycles(session_report):
    _, report = session_report
    width = report.timeline_slice_cycles
    for unit, values in report.timeline.items():
        assert all(0 <= v <= 1 for v in values)
    # the PE stream never overlaps itself, so its busy fraction integrates to its busy cycles
    pe = sum(report.timeline["PE stream"]) * width
    assert pe == pytest.approx(next(u.busy_cycles for u in report.units if u.unit == "PE stream"), rel=1e-3)


def test_json_round_trip_and_csv(session_report, tmp_path):
    _, report = session_report
    report.save(tmp_path / "r.json")
    again = Report.load(tmp_path / "r.json")
    assert again == report
    from mlsdk.render import csv_text
    rows = list(csv.DictReader(io.StringIO(csv_text(report))))
    total = [r for r in rows if r["section"] == "summary" and r["metric"] == "total_cycles"]
    assert int(total[0]["value"]) == report.total_cycles
    host = [r for r in rows if r["section"] == "handovers" and r["metric"] == "saved_vs_host" and r["value"]]
    assert [int(r["value"]) for r in host] == [report.handovers[0].saved_vs_host]
    chain = [r for r in rows if r["section"] == "chains" and r["metric"] == "as_run"]
    assert [int(r["value"]) for r in chain] == [report.chains[0].as_run]
    with pytest.raises(ValueError, match="not an mnsim report"):
        Report.from_json({"format": "other"})


def test_narrow_console_folds_names_and_keeps_every_figure(tmp_path):
    """A model's long parameter names on an 80-column console: the names fold onto more lines,
    every figure of the bindings table is printed whole."""
    from rich.console import Console

    from mlsdk.render import text
    ctx = Context(MNDevice("mini:auto"))
    weight = torch.ones(8, 16)
    long_name = "model@transformer@h@11@attn@c_attn@weight@with@a@long@path"
    module = torch.nn.Module()
    module.register_parameter("p", torch.nn.Parameter(weight))
    set_tensor_name_in_module(module, long_name)
    ctx.register_param(module.p)
    fn = ctx.compile(lambda d: {"y": d["x"] * module.p}, {"x": torch.zeros(8, 16)}, tmp_path / "s")
    for _ in range(12):
        fn({"x": torch.ones(8, 16)})["y"].cpu()
    report = build([ctx.session], "narrow")
    console = Console(file=io.StringIO(), width=80)
    text(report, console)
    out = console.file.getvalue()
    bindings = out[out.index("input bindings"):]
    assert "…" not in bindings
    for row in report.bindings:
        assert f"{row.cycles:,}" in bindings and f" {row.calls} " in bindings
    assert max(len(line) for line in out.splitlines()) <= 80


def test_report_refuses_mixed_chips_and_reference_runs(tmp_path):
    a, b = Context(MNDevice("mini:auto")), Context(MNDevice("mncore2_2groups:auto"))
    for c in (a, b):
        c.compile(scale, {"x": torch.zeros(2, 2)}, tmp_path / c.device.chip)({"x": torch.ones(2, 2)})
    with pytest.raises(ValueError, match="different chips"):
        build([a.session, b.session])
    with pytest.raises(ValueError, match="nothing ran on a simulated chip"):
        build([Context(MNDevice("pfvm:cpu")).session])


def test_png_has_both_plots(session_report, tmp_path):
    from mlsdk.plots import png
    _, report = session_report
    png(report, tmp_path / "r.png")
    import matplotlib.image as mpimg
    image = mpimg.imread(tmp_path / "r.png")
    assert image.shape[0] > 700 and image.shape[1] > 800, "three panels: bindings, runs and utilisation"


def test_run_labels_name_the_context_when_functions_repeat(tmp_path):
    from mlsdk.plots import run_labels
    contexts = [Context(MNDevice("mini:auto")) for _ in range(2)]
    for ctx in contexts:
        ctx.compile(scale, {"x": torch.zeros(2, 2)}, None)({"x": torch.ones(2, 2)})["y"].cpu()
    only = Context(MNDevice("mini:auto"))
    only.compile(lambda d: {"z": d["x"] - 1}, {"x": torch.zeros(2, 2)}, None)({"x": torch.ones(2, 2)})
    report = build([c.session for c in [*contexts, only]])
    labels = run_labels(report)
    first, second = (c.runtime.label for c in contexts)
    assert f"call: scale ({first})" in labels and f"call: scale ({second})" in labels
    assert [x for x in labels if x.startswith("call: lambda")] == ["call: " + only.session.calls[0].function]


def test_comparison_aligns_runs_by_name_and_marks_what_one_side_lacks():
    from mlsdk.render import aligned
    rows = aligned([("call: f", 10), ("call: g", 5), ("call: f", 12)], [("call: f", 20), ("upload: x", 3)])
    assert rows == [("call: f", 10, 20), ("call: g (only in the first)", 5, None),
                    ("call: f #2 (only in the first)", 12, None), ("upload: x (only in the second)", None, 3)]



def test_comparison_shows_the_engine_cycles_of_short_mvs_where_either_side_has_some():
    from rich.console import Console

    from mlsdk.render import comparison

    def shown(a: Report, b: Report) -> str:
        console = Console(record=True, width=160)
        console.print(comparison(a, b))
        return console.export_text()
    a, b = Report("mini", 1, 100, short_mvs=3, short_mv_cycles=12), Report("mini_unit16", 1, 80)
    line = next(x for x in shown(a, b).splitlines() if "engine cycles of MVs shorter than their unit" in x)
    assert [cell.strip() for cell in line.split("│")[2:4]] == ["12", "0"]
    assert "shorter than their unit" not in shown(b, b)


# ---- commands ---------------------------------------------------------------------------------


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_mnsim_run_seed_text_and_json_agree(capsys, tmp_path):
    code, out = run_cli(capsys, "run", "--device", "mini:auto", SEED)
    assert code == 0
    assert out.splitlines()[0] == "producer -> consumer direct-use succeeded"
    assert "relocation" in out and "hand-overs" in out and "the layouts match without a constraint" in out
    code, out = run_cli(capsys, "run", "--device", "mini:auto", "--report", "json", SEED)
    data = json.loads(out[out.index("{"):])
    (reloc,) = [b for b in data["bindings"] if b["path"] == "relocation"]
    assert (reloc["function"], reloc["input"], reloc["calls"]) == ("consumer", "shared", 1)
    (h,) = data["handovers"]
    assert h["saved"] == 0 and h["saved_vs_host"] > 0 and h["as_run"] == h["with_constraint"]
    assert (h["producer"], h["consumers"]) == ("producer.shared", ["consumer.shared"])
    assert data["chip"] == "mini"


def test_mnsim_run_writes_files_and_a_trace(capsys, tmp_path):
    out_json, trace = tmp_path / "r.json", tmp_path / "t.json"
    code, out = run_cli(capsys, "run", "--device", "mini:auto", "--report", "json", "--out", str(out_json),
                        "--trace", str(trace), SEED, "--device", "mncore2:auto")
    assert code == 0 and f"report: {out_json}" in out
    report = Report.load(out_json)
    assert report.chip == "mini", "mnsim's --device wins over the script's own"
    events = json.loads(trace.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"PE stream", "Data Engine 0", "host link"} <= tracks
    for fmt, name in (("csv", "r.csv"), ("png", "r.png"), ("text", "r.txt")):
        code, _ = run_cli(capsys, "run", "--device", "mini:auto", "--report", fmt, "--out", str(tmp_path / name), SEED)
        assert code == 0 and (tmp_path / name).stat().st_size > 0


def test_mnsim_run_reports_conversion_advice(capsys, tmp_path, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code, out = run_cli(capsys, "run", "--device", "mncore2:auto", CHAIN)
    assert code == 0
    assert "advice: compile producer with io_spec_constraints={'scores': consumer.input_specs['scores']}" in out


def test_mnsim_run_script_failure_exit_code(capsys, tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("import torch\nfrom mlsdk import Context, MNDevice\n"
                      "c = Context(MNDevice('mncore2:auto'))\n"
                      "f = c.compile(lambda d: {'y': d['x'] + 1}, {'x': torch.zeros(2)}, None)\n"
                      "f({'x': torch.zeros(2)})\nraise RuntimeError('boom')\n")
    code, out = run_cli(capsys, "run", "--device", "mini:auto", str(script))
    assert code == 1 and "mnsim report" in out
    assert main(["run", str(tmp_path / "missing.py")]) == 1


def test_mnsim_report_codegen_dir_and_json(capsys, tmp_path):
    ctx = Context(MNDevice("mini:auto"))
    ctx.compile(scale, {"x": torch.zeros(8, 16)}, tmp_path / "scale")
    code, out = run_cli(capsys, "report", str(tmp_path / "scale"), "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["chip"] == "mini"
    summary = json.loads((tmp_path / "scale" / "summary.json").read_text())
    assert data["total_cycles"] == summary["estimated_cycles"]
    Report.from_json(data).save(tmp_path / "r.json")
    code, out = run_cli(capsys, "report", str(tmp_path / "r.json"))
    assert code == 0 and f"{data['total_cycles']:,} cycles" in out
    assert main(["report", str(tmp_path / "nothing")]) == 1
    (tmp_path / "bad.json").write_text("{}")
    assert main(["report", str(tmp_path / "bad.json")]) == 1


def test_mnsim_compare_shows_where_the_variant_differs(capsys):
    code, out = run_cli(capsys, "compare", "--device", "mncore2:auto", "--device", "mncore2_fastdram:auto",
                        "--report", "json", SEED)
    assert code == 0
    data = json.loads(out[out.index("{"):])
    a, b = data["a"], data["b"]
    assert (a["chip"], b["chip"]) == ("mncore2", "mncore2_fastdram")
    assert b["total_cycles"] < a["total_cycles"], "doubled DRAM and Data Engine rates shorten the run"
    code, out = run_cli(capsys, "compare", "--device", "mncore2:auto", "--device", "mncore2_fastdram:auto", SEED)
    assert "mncore2_fastdram / mncore2" in out and "total cycles" in out
    assert main(["compare", "--device", "mini:auto", SEED]) == 1
    capsys.readouterr()
    assert main(["compare", "--device", "mini:auto", "--device", "nochip", SEED]) == 1
    captured = capsys.readouterr()
    assert "--device nochip: unknown device" in captured.err
    assert "direct-use succeeded" not in captured.out, "refused before the script ran on the first chip"


def test_compare_aligns_units_the_other_chip_lacks(capsys):
    code, out = run_cli(capsys, "compare", "--device", "mini:auto", "--device", "mncore2_2groups:auto", SEED)
    assert code == 0
    assert "busy: Data Engine 1 (only in the second)" in out


def test_call_report_and_context_report(session_report):
    from mlsdk.report import for_call
    ctx, whole = session_report
    assert ctx.report().total_cycles == whole.total_cycles
    last = for_call(ctx.session)
    assert [r.kind for r in last.runs] == ["call"], "the last call's input was relocated: no binding run"
    first = for_call(ctx.session, 0)
    assert [r.kind for r in first.runs] == ["binding", "call"]
    assert first.total_cycles == sum(r.stats.total_cycles for r in ctx.session.runs[:2])
    assert [b.path for b in first.bindings] == ["upload"] and [b.path for b in last.bindings] == ["relocation"]


def test_failed_binding_frees_what_it_uploaded(tmp_path):
    ctx = Context(MNDevice("mini:auto"))
    other = Context(MNDevice("mini:1"))
    fn = ctx.compile(lambda d: {"y": d["a"] + d["b"]}, {"a": torch.zeros(4, 8), "b": torch.zeros(4, 8)}, None)
    foreign = other.compile(scale, {"x": torch.zeros(4, 8)}, None)({"x": torch.ones(4, 8)})["y"]
    fn({"a": torch.ones(4, 8), "b": torch.ones(4, 8)})  # loads the program's constants
    held = ctx.device.board.allocated_lw()
    with pytest.raises(Exception, match="of Context #\\d+ on mini:1, whose device is not this one"):
        fn({"a": torch.ones(4, 8), "b": foreign})
    assert ctx.device.board.allocated_lw() == held


def test_timeline_ends_with_the_session(tmp_path):
    ctx = Context(MNDevice("mini:auto"))
    ctx.compile(scale, {"x": torch.zeros(8, 16)}, None)({"x": torch.ones(8, 16)})["y"].cpu()
    report = build([ctx.session])
    slices = len(report.timeline["PE stream"])
    assert (slices - 1) * report.timeline_slice_cycles < report.total_cycles <= slices * report.timeline_slice_cycles


def test_bindings_are_summed_over_calls(session_report, tmp_path):
    ctx, _ = session_report
    fn = ctx.compile(scale, {"x": torch.zeros(8, 16)}, None)  # compiled again: a function of its own
    assert fn.name == "scale#2"
    for _ in range(3):
        fn({"x": torch.ones(8, 16)})
    report = build([ctx.session])
    uploads = {b.function: b for b in report.bindings if b.path == "upload"}
    assert (uploads["scale"].calls, uploads["scale#2"].calls) == (1, 3)
    each = [b.cycles for b in ctx.session.bindings if b.path == "upload" and b.function == "scale#2"]
    assert uploads["scale#2"].cycles == sum(each) and len(each) == 3
    assert fn.last_call.function == "scale#2" and fn.last_call is ctx.session.calls[-1]


def test_lambdas_are_named_by_where_they_are(tmp_path):
    ctx = Context(MNDevice("mini:auto"))
    f = ctx.compile(lambda d: {"y": d["x"] + 1}, {"x": torch.zeros(2, 2)}, None)
    assert f.name.startswith("lambda@test_reports.py:")


def test_mnsim_run_bad_options_fail_before_the_script_runs(capsys, tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    assert main(["run", "--device", "bogus:auto", str(script)]) == 1
    assert main(["run", "--trace", str(tmp_path / "nodir" / "t.json"), str(script)]) == 1
    captured = capsys.readouterr()
    assert "ran" not in captured.out
    assert "unknown device 'bogus:auto'" in captured.err and "no directory" in captured.err


def test_mnsim_run_passes_on_sys_exit_messages(capsys, tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import sys\nsys.exit('giving up')\n")
    assert main(["run", str(script)]) == 1
    assert "giving up" in capsys.readouterr().err


def test_overlapping_transfers_count_once_in_the_timeline():
    from mlsdk.report import _covered
    starts, ends = np.array([20, 0, 5]), np.array([25, 10, 15])  # [0,15) and [20,25) once merged
    at = np.array([0, 5, 12, 18, 22, 30])
    assert _covered(starts, ends, at).tolist() == [0, 5, 12, 15, 17, 20]
    assert _covered(np.array([], dtype=np.int64), np.array([], dtype=np.int64), at).tolist() == [0] * 6


def test_mvs_shorter_than_their_unit_are_reported_with_their_engine_cycles(tmp_path):
    """A small MLP's training step gathers its weight gradient into the weight's layout in runs
    of single long words: the report counts those MVs and the engine cycles they took, as the
    runs' RunStats do, in its text, CSV and JSON."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    ctx = Context(MNDevice("mini:auto"))
    opt = MNCoreSGD(model.parameters(), 0.1, 0.9)
    registered(ctx, model, opt)

    def step(d):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(d["x"]), d["t"])
        loss.backward()
        opt.step()
        return {"loss": loss}
    batch = {"x": torch.randn(16, 64), "t": torch.randint(0, 10, (16,))}
    ctx.compile(step, batch, None)(batch)
    report = build([ctx.session], "mlp")
    runs = ctx.session.runs
    assert report.short_mvs == sum(r.stats.short_mvs for r in runs) > 0
    assert report.short_mv_cycles == sum(r.stats.short_mv_cycles for r in runs) > 0
    assert report.engine_busy_cycles == sum(sum(r.stats.engine_busy) for r in runs) >= report.short_mv_cycles
    from rich.console import Console

    from mlsdk.render import csv_text, short_mvs_line, text
    console = Console(record=True, width=200)
    text(report, console)
    assert short_mvs_line(report) in console.export_text()
    assert f"{report.short_mvs:,} MVs shorter than their mode's unit" in short_mvs_line(report)
    rows = {r["metric"]: int(r["value"]) for r in csv.DictReader(io.StringIO(csv_text(report)))
            if r["metric"].startswith("short_mv")}
    assert rows == {"short_mvs": report.short_mvs, "short_mv_engine_cycles": report.short_mv_cycles}
    report.save(tmp_path / "r.json")
    assert Report.load(tmp_path / "r.json") == report
