"""`mnsim hw ...` shows figures derived from the YAML and reports errors with file:line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mlsdk.cli import main


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_show_mncore2_headline_figures(capsys):
    code, out = run(capsys, "hw", "show", "mncore2")
    assert code == 0
    assert "4096 PEs, 1024 MABs, 16 GiB DRAM" in out
    for peak in ("12.29 TFLOP/s", "49.15 TFLOP/s", "98.3 TFLOP/s", "393.2 TFLOP/s"):
        assert peak in out
    assert "dram_to_l2bm" in out and "384 GB/s" in out  # 16 LW/cycle x 8 B x 750 MHz x 4 Groups
    assert "24.58 TB/s" in out  # the PE-side distribute and collect: 64 LW/cycle x 64 L1Bs


def test_show_mini_and_sources(capsys):
    code, out = run(capsys, "hw", "show", "mini", "--sources")
    assert code == 0 and "16 PEs, 4 MABs, 64 MiB DRAM" in out
    assert "mini.yaml:10" in out and "driver knob" in out  # where each value was set, and why


def test_list(capsys):
    code, out = run(capsys, "hw", "list")
    assert code == 0 and "mncore2_fastdram" in out and "4096" in out


def test_diff_shows_written_and_derived_changes(capsys):
    code, out = run(capsys, "hw", "diff", "mncore2", "mncore2_2groups")
    assert code == 0
    assert "levels.Group.count" in out and "written" in out
    assert "count.PE" in out and "2048" in out and "8 GiB" in out


def test_validate_ok_and_error(capsys, tmp_path):
    assert run(capsys, "hw", "validate", "mini")[0] == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: mncore2\nname: bad\nlevels:\n  PE: {count: 0}\n")
    code, out = run(capsys, "hw", "validate", str(bad))
    assert code == 1 and f"{bad}:4: levels.PE.count" in out.replace("\n", "")


def test_console_script_entry_point():
    script = Path(sys.executable).parent / "mnsim"  # installed by `pip install -e .` next to python
    result = subprocess.run([str(script), "hw", "show", "mini"], capture_output=True, text=True, check=True)
    assert "16 PEs" in result.stdout
