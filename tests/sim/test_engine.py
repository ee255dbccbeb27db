"""The functional engine's dispatch: kernels cached on disk, programs bound once per buffer set.

A kernel that numba cannot find in its disk cache is compiled again in every process (0.6 s per
VOP loop); loops made by a factory used to overwrite each other's cache files. A program keeps its
latest binding and its timing (which depends neither on data nor on addresses).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

import sim

ROOT = Path(__file__).resolve().parents[2]

# Runs a program touching every cached kernel family (moves, the fast VOP loops, the generic
# VOP loop, both reductions, the timing loop) and prints the sim functions numba compiled.
PROGRAM = """
import json
from numba.core import event
import hwdesc, sim

class Compiled(event.Listener):
    names = []
    def on_start(self, ev): pass
    def on_end(self, ev):
        func = ev.data["dispatcher"].py_func
        if func.__module__.startswith("sim."):
            Compiled.names.append(func.__module__ + "." + func.__qualname__)

m = sim.Machine(hwdesc.load("mini"))
b = sim.ProgramBuilder(m.params)
b.mv("individual", "DRAM", 0, "L2BM", 0, 8, tag=1)
b.wait(1)
b.xfer("mab_broadcast", "down", "L1BM", 0, "LM0", 0, 16)
for op in ("add", "sub", "mul", "max", "copy", "relu", "exp"):
    b.vop(op, "float32", 1, 8, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), ("LM0", 0, 0, 1))
b.vop("fma", "float32", 1, 8, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), ("LM0", 0, 0, 1), ("LM1", 0, 0, 1))
for op in ("add", "sub", "copy"):
    b.vop(op, "int32", 1, 8, ("LM1", 0, 0, 1), ("LM0", 0, 0, 1), ("LM0", 0, 0, 1))
b.mv("reduce", "L2BM", 0, "DRAM", 8, 8, tag=2, red="add")  # every Group: its L2Bs -> its DRAM
b.xfer("reduce", "up", "L2BM", 0, "L1BM", 0, 16, red="add", dtype="float16")
b.wait(2)
m.grow("DRAM", 256)
with event.install_listener("numba:compile", Compiled()):
    m.run(b.build())
print(json.dumps(Compiled.names))
"""


def _compiled_in_a_new_process() -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_compiles_no_kernel():
    _compiled_in_a_new_process()  # fills the cache if this checkout has not yet
    assert _compiled_in_a_new_process() == []


def _add_program(machine: sim.Machine) -> sim.Program:
    b = sim.ProgramBuilder(machine.params)
    b.mv("individual", "DRAM", sim.Sym("x"), "L2BM", 0, 8, tag=1)
    b.wait(1)
    b.mv("individual", "L2BM", 0, "DRAM", sim.Sym("y"), 8, tag=2)
    b.wait(2)
    return b.build()


def test_a_program_rebound_to_other_buffers_moves_their_data(mini):
    machine = sim.Machine(mini)
    program = _add_program(machine)
    words = machine.params.words_per_lw * 8
    machine.grow("DRAM", 4 * words)
    dram = machine.memory("DRAM")
    dram[:, :4 * words] = np.arange(4 * words, dtype=np.uint32)
    first = machine.run(program, bases={"x": 0, "y": 8})
    other = machine.run(program, bases={"x": 16, "y": 24})
    assert other is first  # timed once: the addresses change no cycle
    dram = machine.memory("DRAM")
    np.testing.assert_array_equal(dram[:, words:2 * words], dram[:, :words])
    np.testing.assert_array_equal(dram[:, 3 * words:4 * words], dram[:, 2 * words:3 * words])


def test_the_cache_of_sim_kernels_is_dropped_when_any_sim_source_changes(tmp_path):
    from sim import jitcache

    kernel, other = tmp_path / "vector.loop_max_float32-56.py311.nbi", tmp_path / "mylib.f-3.py311.nbi"
    for path in (kernel, other):
        path.write_bytes(b"cached")
    assert jitcache.refresh(tmp_path, "digest-1", {"vector", "numerics"}) == [kernel.name]
    assert not kernel.exists() and other.exists()  # another library's cache is not ours to drop
    kernel.write_bytes(b"cached")
    assert jitcache.refresh(tmp_path, "digest-1", {"vector", "numerics"}) == []  # built from these sources
    assert kernel.exists()
    assert jitcache.refresh(tmp_path, "digest-2", {"vector", "numerics"}) == [kernel.name]


def test_the_digest_covers_every_sim_source(tmp_path):
    from sim import jitcache

    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("x = 1\n")
    before = jitcache.sources_digest(tmp_path)
    (tmp_path / "b.py").write_text("x = 2\n")
    assert jitcache.sources_digest(tmp_path) != before


def test_a_run_grows_dram_to_the_farthest_word_its_mvs_reach(mini):
    """max_addresses: per memory, the end of the farthest MV reading or writing it, in words; a run
    grows DRAM to hold it (past the 64 Ki words DRAM grows by at least, so the growth is its)."""
    from sim.validate import max_addresses
    machine = sim.Machine(mini)
    b = sim.ProgramBuilder(machine.params)
    b.mv("individual", "DRAM", 64, "L2BM", 0, 64, tag=1)
    b.mv("individual", "L2BM", 0, "DRAM", 40000, 8, tag=2)
    b.mv("individual", "DRAM", 512, "L2BM", 64, 16, tag=1)
    b.wait(1)
    b.wait(2)
    program = b.build()
    p, wpl = machine.params, machine.params.words_per_lw
    assert max_addresses(p, program.code) == {p.memory_id("DRAM"): wpl * 40008, p.memory_id("L2BM"): wpl * 80}
    assert wpl * 40008 > 1 << 16
    machine.run(program)
    assert machine.memory("DRAM").shape[1] >= wpl * 40008
