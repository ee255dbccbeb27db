"""Values that are a valid chip but not one mnsim can serve are refused at load (`hw validate`),
with the file, the line, the key and the bound, before they overflow a counter or the host."""

from __future__ import annotations

import re

import pytest

import hwdesc
from hwdesc import bounds
from tests.hwdesc.test_errors import load_error, write


@pytest.mark.parametrize("name, body, key, message", [
    ("latency", """
        transfers:
          dram_to_l2bm:
            latency_cycles: 100000000000000000000  # <-
        """, "transfers.dram_to_l2bm.latency_cycles",
     rf"above the bound {bounds.MAX_CYCLES_PER_ITEM} \(2\^40\): cycles are int64"),
    ("pes", """
        levels:
          PE:
            count: 1000000000000  # <-
        """, "levels.PE.count", r"the memories other than DRAM take .* GiB \(LM0: 1024000000000000 instances, .*\); mnsim "
                       r"allocates them when a machine is made and serves at most 4 GiB"),
    ("mab5", """
        levels:
          MAB:
            count: 5  # <-
        """, "levels.MAB.count", "5 is not a power of two: mnsim's compiler lays tensors out only over axes of power-of-two sizes"),
    ("word", """
        word_bytes: 8  # <-
        """, "word_bytes", "8 is not supported: mnsim's memories are arrays of 4-byte words"),
    ("rate", """
        transfers:
          dram_to_l2bm:
            modes:
              individual:
                src_lw_per_cycle: 0.0000001  # <-
        """, "transfers.dram_to_l2bm.modes.individual.src_lw_per_cycle", "1e-07 LW/cycle is below the bound"),
    ("issues", """
        pe_ops:
          exp:
            issues: 1000000000000  # <-
        """, "pe_ops.exp.issues", "1000000000000 issues per lane group is above the bound 262144"),
    ("hazard", """
        hazards:
          lm_write_to_read: 100  # <-
        """, "hazards.lm_write_to_read", "100 steps is above the bound 16"),
    ("pseudo_bits", """
        formats:
          pfloat32:
            bits: 64  # <-
        """, "formats.pfloat32.bits", "pseudo-single is stored as float32 with low mantissa bits ignored: bits "
                                      "must be float32's 32, not 64"),
    ("faces", """
        memories:
          MREG:
            faces: 3  # <-
        """, "memories.MREG.faces", "3 faces do not split 128 address units evenly"),
    ("single", """
        formats:
          float32:
            mantissa_bits: 22  # <-
        """, "formats.float32.mantissa_bits", "22 is not supported: mnsim computes float32 in the host's 32-bit type, "
                                              "1-8-23"),
    ("double", """
        formats:
          float64:
            exponent_bits: 5  # <-
        """, "formats.float64.exponent_bits", "5 is not supported: mnsim computes float64 in the host's 64-bit type"),
    ("int", """
        formats:
          int32:
            mantissa_bits: 15  # <-
        """, "formats.int32.mantissa_bits", "15 is not supported: mnsim computes int32 in the host's 32-bit type"),
    ("tags", """
        data_engine:
          tags: 8  # <-
        """, "data_engine.tags", "8 is below the bound 10: mnsim's programs use completion tags 1..10"),
    ("stream_latency", """
        transfers:
          l2bm_to_l1bm:
            latency_cycles: 5  # <-
        """, "transfers.l2bm_to_l1bm.latency_cycles", "5 is not supported: the PE stream is lock-step"),
    ("collect_chunk", """
        transfers:
          l1bm_to_l2bm:
            modes:
              collect:
                chunk_lw: 16  # <-
        """, "transfers.l1bm_to_l2bm.modes.collect.chunk_lw",
     r"16 is not supported: a collect takes back the chunks of its path's distribute "
     r"\(transfers.l2bm_to_l1bm.modes.distribute.chunk_lw: 8\)"),
    ("queue", """
        data_engine:
          queue_depth: 3000000000  # <-
        """, "data_engine.queue_depth", "3000000000 is above the bound 65536: mnsim's timing keeps an array entry"),
    ("window", """
        host_link:
          window_bytes: 8  # <-
        """, "host_link.window_bytes", "8 bytes is below the bound 16: the window is used in two halves"),
    ("unit", """
        transfers:
          dram_to_l2bm:
            modes:
              individual:
                unit_lw: 2000000000000  # <-
        """, "transfers.dram_to_l2bm.modes.individual.unit_lw",
     "2000000000000 long words is above the bound 32768: a transfer moves whole units"),
    ("missing_hazard", """
        hazards:  # <-
          lm_write_to_read: null
        """, "hazards", "hazard 'lm_write_to_read' is missing: the compiler and the hazard check read every one"),
    ("unknown_hazard", """
        hazards:
          lm_write_to_raed: 2  # <-
        """, "hazards.lm_write_to_raed", "unknown hazard 'lm_write_to_raed'; expected one of the hazards: "
                                         "lm_write_to_read, grf_write_to_read"),
])
def test_a_value_mnsim_cannot_serve_is_refused_with_its_line(tmp_path, name, body, key, message):
    path, line = write(tmp_path, f"{name}.yaml", f"extends: mncore2\nname: {name}\n" + body.replace("\n        ", "\n"))
    e = load_error(path)
    assert (e.file, e.line, e.key_path) == (str(path), line, key)
    assert re.search(message, str(e)), str(e)


def test_mncore2_and_its_variants_are_within_every_bound():
    for name in hwdesc.names():
        assert bounds.check_bounds(hwdesc.load(name)) == []
