"""The simulator reaches the figures `hw show` prints, per transfer path and mode and per number
format, within 2 %: one large instruction of each kind, timed, against `hwdesc.figures`."""

from __future__ import annotations

import numpy as np
import pytest

import hwdesc
import sim
from hwdesc import figures

CHIPS = ("mini", "mncore2", "mncore2_2groups")
WITHIN = 0.02


def _bandwidths(chip: str) -> list[figures.PathBandwidth]:
    return figures.path_bandwidths(hwdesc.load(chip))


def _cases():
    return [pytest.param(chip, b.transfer, b.mode, id=f"{chip}-{b.transfer}-{b.mode}")
            for chip in CHIPS for b in _bandwidths(chip)]


def _largest(step: int, *limits: float) -> int:
    n = int(min(limits)) // step * step
    assert n > 0
    return n


def _microbenchmark(m: sim.Machine, transfer: str, mode: str) -> tuple[sim.Program, int]:
    """One instruction moving as much as the memories allow on this path in this mode, and its
    payload (the long words it names)."""
    hw, p = m.hw, m.params
    t = hw.transfers[transfer]
    lw_cap = {name: hw.memory_lw(name) if hw.memories[name].address_unit == "long_word"
              else hw.memory_words(name) // (hw.long_word_bytes // hw.word_bytes) for name in hw.memories}
    b = sim.ProgramBuilder(p)
    red = "add" if mode == "reduce" else "none"
    src_share, dst_share = figures.side_shares(hw, transfer, mode)
    if t.engine == "host_link":
        window = int(hw.host_link.window_bytes) // hw.long_word_bytes
        n = _largest(t.modes[mode].unit_lw, window)
        b.host_dma(t.src == ("host",), 0, 0, 0, n, tag=1)
    elif t.engine == "data_engine":
        src, dst = t.src[0], t.dst[0]
        unit = max(t.modes[mode].unit_lw, (t.modes[mode].chunk_lw or 1) * max(src_share, dst_share))
        cap = min(lw_cap[src] * src_share, lw_cap[dst] * dst_share, 1 << 20)
        n = _largest(unit, cap)
        if src == "DRAM" or dst == "DRAM":
            m.grow("DRAM", n * 2 * hw.long_word_bytes // hw.word_bytes)
        b.mv(mode, src, 0, dst, 0, n, tag=1, red=red, scope="chip" if mode == "distributed_broadcast" else "group")
    else:
        mems = [x for x in (*t.src, *t.dst) if x in hw.memories]
        upper, lower = min(mems, key=hw.memory_instances), max(mems, key=hw.memory_instances)
        down = upper in t.src
        share = dst_share if down else src_share
        step = max(src_share, dst_share) * ((t.modes[mode].chunk_lw or 1) if mode in ("distribute", "collect") else 1)
        n = _largest(step, lw_cap[upper], lw_cap[lower] * share)
        b.xfer(mode, "down" if down else "up", upper, 0, lower, 0, n, red=red)
    if t.engine != "pe_stream":
        b.wait(1)
    return b.build(), n


@pytest.mark.parametrize("chip, transfer, mode", _cases())
def test_each_path_reaches_its_hw_show_figure(chip, transfer, mode):
    hw = hwdesc.load(chip)
    m = sim.Machine(hw)
    figure = next(b for b in figures.path_bandwidths(hw) if (b.transfer, b.mode) == (transfer, mode))
    program, n = _microbenchmark(m, transfer, mode)
    host = [np.zeros(2 * n, dtype=np.uint32)] if hw.transfers[transfer].engine == "host_link" else []
    stats = m.run(program, mode="timing", host=host)
    moving = int(stats.end[0] - stats.start[0])  # the data's own cycles (a transfer's latency comes first)
    achieved = n * figure.engines * hw.long_word_bytes * hw.clock_hz / moving
    assert achieved == pytest.approx(figure.bytes_per_s, rel=WITHIN), (n, moving)


def _words(hw, dtype: str, elements: int) -> int:
    """Words that `elements` elements of `dtype` fill."""
    return -(-elements * hw.formats[dtype].bits // 32)


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("dtype", ["float32", "pfloat32", "float16", "float64"])
def test_the_mau_reaches_its_matrix_peak(chip, dtype):
    """A MATMUL of many row tiles on every MAB at once: FLOP/s against `hw show`'s peak."""
    hw = hwdesc.load(chip)
    m = sim.Machine(hw)
    mode = hw.units["MAU"].matrix[dtype]
    pes = hw.fanout("MAB", "PE")
    k, n = mode.cols * pes, mode.rows * pes
    rows = 32  # C fits beside B in mini's 4 KiB LM1
    c_words = -(-_words(hw, dtype, (k // pes) * n) // 8) * 8  # C after B in LM1, at a multiple of 8 words
    c_at = c_words * 32 // hw.formats[mode.acc].bits  # in elements of C (the mode's accumulator)
    b = sim.ProgramBuilder(m.params)
    b.matmul(dtype, rows, k, n, ("LM0", 0, k // pes), ("LM1", 0, n), ("LM1", c_at, n // pes))
    stats = m.run(b.build(), mode="timing")
    flops = 2 * rows * k * n * hw.instances("MAB") * hw.clock_hz / stats.total_cycles
    assert flops == pytest.approx(figures.peak_flops(hw, dtype, "matrix"), rel=WITHIN)


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("op, dtype", [("add", "float32"), ("add", "float16"), ("max", "float32"),
                                       ("add", "int32"), ("add", "float64")])
def test_vector_ops_reach_their_vector_peak(chip, op, dtype):
    """One VOP over a whole LM: elements per second against the unit's vector lanes in `hw show`."""
    hw = hwdesc.load(chip)
    m = sim.Machine(hw)
    cost = hw.pe_ops[op].cost(dtype)
    unit = hw.units[cost.unit]
    n = hw.memory_words("LM1") * 32 // hw.formats[dtype].bits
    b = sim.ProgramBuilder(m.params)
    b.vop(op, dtype, 1, n, ("LM0", 0, 0, 1), ("LM1", 0, 0, 1), ("LM1", 0, 0, 1))
    stats = m.run(b.build(), mode="timing")
    elements = n * hw.instances("PE") * hw.clock_hz / stats.total_cycles
    lanes = unit.vector[dtype].lanes_per_cycle * hw.instances(unit.level) * hw.clock_hz / cost.issues
    assert elements == pytest.approx(lanes, rel=WITHIN)
