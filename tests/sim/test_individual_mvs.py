"""Individual MVs in every Group at once (a gather's runs), against their definition in numpy:
Group g's `local`-th instance of each side, or a fixed instance, n long words from the source
address to the destination address. MN-Core 2 (4 Groups, 2 L2Bs each); runs split between the
host's threads by Group, and not."""

from __future__ import annotations

import numpy as np
import pytest

import hwdesc
import sim
import sim.functional as functional
from sim.isa import ALL_GROUPS
from sim.params import MachineParams

HW = hwdesc.load("mncore2")
HW_GROUPS = MachineParams.from_hw(HW).n_groups
DRAM_WORDS = 1 << 14


def _expected(m: sim.Machine, mvs: list[dict], before: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    p = m.params
    wpl = p.words_per_lw
    mem = {k: v.copy() for k, v in before.items()}
    for mv in mvs:
        src, dst = mem[mv["src"]], mem[mv["dst"]]
        s_per = src.shape[0] // p.n_groups
        d_per = dst.shape[0] // p.n_groups
        for g in range(p.n_groups):
            s = mv["src_inst"] if mv["src_inst"] != ALL_GROUPS else g * s_per + mv["src_local"]
            d = mv["dst_inst"] if mv["dst_inst"] != ALL_GROUPS else g * d_per + mv["dst_local"]
            n = mv["n"] * wpl
            dst[d, mv["dst_addr"] * wpl: mv["dst_addr"] * wpl + n] = src[s, mv["src_addr"] * wpl: mv["src_addr"] * wpl + n]
            if mv["src_inst"] != ALL_GROUPS and mv["dst_inst"] != ALL_GROUPS:
                break  # one instance to one: once
    return mem


def _run(mvs: list[dict]) -> None:
    m = sim.Machine(HW)
    m.grow("DRAM", DRAM_WORDS)
    rng = np.random.default_rng(7)
    for name in ("DRAM", "L2BM"):
        m.memory(name)[...] = rng.integers(0, 1 << 32, m.memory(name).shape, dtype=np.uint32)
    before = {name: m.memory(name).copy() for name in ("DRAM", "L2BM")}
    b = sim.ProgramBuilder(m.params)
    for mv in mvs:
        b.mv("individual", mv["src"], mv["src_addr"], mv["dst"], mv["dst_addr"], mv["n"], tag=1,
             src_inst=mv["src_inst"], dst_inst=mv["dst_inst"], src_local=mv["src_local"], dst_local=mv["dst_local"])
    b.wait(1)
    m.run(b.build())
    want = _expected(m, mvs, before)
    for name in ("DRAM", "L2BM"):
        np.testing.assert_array_equal(m.memory(name), want[name], err_msg=name)


def _mv(src: str, src_addr: int, dst: str, dst_addr: int, n: int, src_inst: int = ALL_GROUPS,
        dst_inst: int = ALL_GROUPS, src_local: int = 0, dst_local: int = 0) -> dict:
    return dict(src=src, src_addr=src_addr, dst=dst, dst_addr=dst_addr, n=n, src_inst=src_inst, dst_inst=dst_inst,
                src_local=src_local, dst_local=dst_local)


@pytest.mark.parametrize("threads", [False, True])
def test_every_group_between_its_own_instances(monkeypatch, threads):
    shared = []
    if threads:  # every run shared out by Group, however few words it moves
        monkeypatch.setattr(functional, "SHARED_WORDS", 0)
        run_shares = functional.run_shares
        monkeypatch.setattr(functional, "run_shares", lambda work, total: (shared.append(total), run_shares(work, total)))
    mvs = [_mv("DRAM", 5 + 7 * k, "L2BM", 3 * k, n, dst_local=k % 2)
           for k, n in enumerate([1, 2, 3, 1, 1, 2, 5, 1, 64])]
    mvs += [_mv("L2BM", 40 + k, "DRAM", 900 + 11 * k, n, src_local=(k + 1) % 2) for k, n in enumerate([1, 2, 4])]
    _run(mvs)
    assert shared == ([HW_GROUPS] if threads else [])


def test_one_instance_to_one_reads_what_every_group_wrote_before_it():
    """In one run, in program order: every Group's second L2B written, Group 1's second L2B (instance
    3) copied into Group 0's DRAM, then in every Group a long word read from there into its first
    L2B and written back."""
    _run([_mv("DRAM", 17, "L2BM", 8, 3, dst_local=1),
          _mv("L2BM", 8, "DRAM", 2000, 2, src_inst=3, dst_inst=0),
          _mv("DRAM", 2001, "L2BM", 50, 1, dst_local=0),
          _mv("L2BM", 50, "DRAM", 2001, 1)])
