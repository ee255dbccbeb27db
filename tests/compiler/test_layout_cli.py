"""`mnsim layout show` and `mnsim layout candidates`."""

from __future__ import annotations

from mlsdk.cli import main


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_show_lm_layout_with_where(capsys):
    code, out = run(capsys, "layout", "show", "(256,16)/((8_L2B:1, 4:2, 8_L1B:1), (2:1, 4_PE:1, 2_W:1); B@[MAB])",
                    "--where", "8,0")
    assert code == 0
    assert "footprint: 8 long words (64 B) per LM0 instance" in out
    assert "4096 of 4096 LM0 hold data (256 distinct x 16 replicas)" in out
    assert "16 per element (MAB x16)" in out
    assert "element (8, 0): 16 place(s)" in out
    row = next(line for line in out.splitlines() if line.startswith("│ 0") and "│ 2 " in line)
    # row 8: L2B 8 div 32 = 0, L1B 8 mod 8 = 0, MAB 0 (first copy), PE 0, LW 2, W 0, word $lm4
    assert [c.strip() for c in row.strip("│").split("│")] == ["0", "0", "0", "0", "0", "2", "0", "4", "0"]


def test_show_dram_layout(capsys):
    code, out = run(capsys, "layout", "show", "((4_L2B:2, 64:8), (8:1, 2_W:1))", "--memory", "DRAM", "--where", "130,9")
    assert code == 0 and "512 long words (4 KiB) per DRAM instance" in out and "4 of 4 DRAM" in out
    assert "word address" not in out


def test_show_on_mini_and_a_layout_that_does_not_fit(capsys):
    code, out = run(capsys, "layout", "show", "((1024:1, 2_W:1))", "--hw", "mini")
    assert code == 0 and "does not fit: LM0 holds 512 long words" in out


def test_errors_are_reported_not_raised(capsys):
    code, out = run(capsys, "layout", "show", "((4:2), (4:1))")
    assert code == 1 and "address overlap" in out
    code, out = run(capsys, "layout", "show", "((4:2)")
    assert code == 1 and "expected" in out and "^" in out


def test_candidates_differ_between_chips(capsys):
    _, big = run(capsys, "layout", "candidates", "32,64")
    _, small = run(capsys, "layout", "candidates", "32,64", "--hw", "mini")
    assert "8_L1B" in big and "2_L1B" in small and "8_L1B" not in small


def test_the_readmes_layout_examples_run(capsys):
    """Every `mnsim layout` line of the README's examples runs (one named the 1-L2B mini chip for
    a layout over four L2Bs and failed)."""
    import shlex
    from pathlib import Path
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    lines = [line for line in readme.splitlines() if line.startswith("mnsim layout ")]
    assert len(lines) >= 3
    for line in lines:
        code, out = run(capsys, *shlex.split(line)[1:])
        assert code == 0, (line, out)
