"""Malformed descriptions fail with HwDescError naming the file, the line and the key path."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import hwdesc
from hwdesc import HwDescError


def write(tmp_path: Path, name: str, text: str) -> tuple[Path, int]:
    """Write a YAML file; return its path and the 1-based line marked `# <-`."""
    text = textwrap.dedent(text).lstrip("\n")
    lines = [i + 1 for i, line in enumerate(text.splitlines()) if "# <-" in line]
    path = tmp_path / name
    path.write_text(text)
    return path, (lines[0] if lines else 0)


def load_error(path: Path) -> HwDescError:
    with pytest.raises(HwDescError) as info:
        hwdesc.load(path)
    return info.value


def test_unknown_key_names_the_allowed_keys(tmp_path):
    path, line = write(tmp_path, "typo.yaml", """
        extends: mncore2
        name: typo
        levels:
          L1B:
            cuont: 4  # <-
        """)
    e = load_error(path)
    assert (e.file, e.line, e.key_path) == (str(path), line, "levels.L1B.cuont")
    assert "unknown key 'cuont'; expected one of: count, axis, doc" in str(e)


def test_wrong_type(tmp_path):
    path, line = write(tmp_path, "wrongtype.yaml", """
        extends: mncore2
        name: wrongtype
        clock_hz: fast  # <-
        """)
    e = load_error(path)
    assert (e.file, e.line, e.key_path) == (str(path), line, "clock_hz")
    assert "expected a valid integer, got 'fast'" in str(e)


def test_missing_key_points_at_the_mapping_that_lacks_it(tmp_path):
    path, line = write(tmp_path, "missing.yaml", """
        extends: mncore2
        name: missing
        memories:
          SRAM:  # <-
            level: PE
            capacity_bytes: 1 KiB
            address_unit: word
            ports: 1RW
            location: false
        """)
    e = load_error(path)
    assert (e.file, e.line, e.key_path) == (str(path), line, "memories.SRAM.lw_per_cycle")
    assert "missing key 'lw_per_cycle'" in str(e)


@pytest.mark.parametrize("count", [0, -2])
def test_impossible_counts(tmp_path, count):
    path, line = write(tmp_path, "zero.yaml", f"""
        extends: mncore2
        name: zero
        levels:
          MAB: {{count: {count}}}  # <-
        """)
    e = load_error(path)
    assert (e.file, e.line, e.key_path) == (str(path), line, "levels.MAB.count")
    assert f"expected greater than 0, got {count}" in str(e)


def test_path_between_memories_that_do_not_exist(tmp_path):
    path, line = write(tmp_path, "l3.yaml", """
        extends: mncore2
        name: l3
        transfers:
          l2bm_to_l3bm:
            src: L2BM
            dst: L3BM  # <-
            engine: data_engine
            latency_cycles: 10
            modes:
              individual: {src_lw_per_cycle: 8, dst_lw_per_cycle: 8}
        """)
    e = load_error(path)
    assert (e.file, e.line, e.key_path) == (str(path), line, "transfers.l2bm_to_l3bm.dst")
    assert "memory 'L3BM' does not exist" in str(e) and "DRAM" in str(e)


def test_memory_at_a_level_that_does_not_exist(tmp_path):
    path, line = write(tmp_path, "lvl.yaml", """
        extends: mncore2
        name: lvl
        memories:
          LM0:
            level: Core  # <-
        """)
    e = load_error(path)
    assert (e.line, e.key_path) == (line, "memories.LM0.level")
    assert "level 'Core' does not exist; expected one of the levels: Group, L2B, L1B, MAB, PE" in str(e)


def test_extends_missing(tmp_path):
    path, line = write(tmp_path, "orphan.yaml", """
        name: orphan
        extends: mncore9  # <-
        """)
    e = load_error(path)
    assert (e.file, e.line, e.key_path) == (str(path), line, "extends")
    assert "no hardware description named 'mncore9'" in str(e) and "mncore2" in str(e)


def test_extends_circular(tmp_path):
    a, _ = write(tmp_path, "a.yaml", "extends: b.yaml\nname: a\n")
    write(tmp_path, "b.yaml", "extends: a.yaml\nname: b\n")
    e = load_error(a)
    assert "circular extends: a.yaml -> b.yaml -> a.yaml" in str(e)
    assert e.key_path == "extends"


def test_yaml_syntax_error(tmp_path):
    path, line = write(tmp_path, "syntax.yaml", """
        extends: mncore2
        name: syntax
        levels:
          MAB: {count: 4  # <-
        """)
    e = load_error(path)
    assert e.file == str(path) and e.line is not None and e.line >= line
    assert "not valid YAML" in str(e)


def test_duplicate_key(tmp_path):
    path, line = write(tmp_path, "dup.yaml", """
        extends: mncore2
        name: dup
        clock_hz: 1000
        clock_hz: 2000  # <-
        """)
    e = load_error(path)
    assert (e.line, e.key_path) == (line, "clock_hz")
    assert "duplicate key 'clock_hz' (first written on line 3)" in str(e)


def test_bad_confidence_tag(tmp_path):
    path, line = write(tmp_path, "conf.yaml", """
        extends: mncore2
        name: conf
        clock_hz:
          v: 800000000
          conf: rumour  # <-
          src: heard it somewhere
        """)
    e = load_error(path)
    assert (e.line, e.key_path) == (line, "clock_hz.conf")
    assert "unknown confidence tag 'rumour'" in str(e)


def test_all_problems_are_listed(tmp_path):
    path, _ = write(tmp_path, "many.yaml", """
        extends: mncore2
        name: many
        clock_hz: 0
        step_cycles: -1
        """)
    e = load_error(path)
    assert e.key_path == "clock_hz"
    assert len(e.problems) == 2 and "step_cycles" in e.problems[1]


def test_unknown_builtin_name_lists_known_ones():
    with pytest.raises(HwDescError, match="built-in descriptions: mncore2, mini"):
        hwdesc.load("mncore3")


def test_pe_op_dtype_override_with_an_unknown_unit(tmp_path):
    path, line = write(tmp_path, "badunit.yaml", """
        extends: mncore2
        name: badunit
        pe_ops:
          add:
            dtypes:
              int32:
                unit: IPU  # <-
                issues: 1
        """)
    e = load_error(path)
    assert (e.file, e.line, e.key_path) == (str(path), line, "pe_ops.add.dtypes.int32.unit")
    assert "unit 'IPU' does not exist; expected one of the units: MAU, ALU" in str(e)


def test_pe_op_dtype_override_for_an_unknown_format(tmp_path):
    path, line = write(tmp_path, "badfmt.yaml", """
        extends: mncore2
        name: badfmt
        pe_ops:
          add:
            dtypes:
              int8: {unit: ALU, issues: 1}  # <-
        """)
    e = load_error(path)
    assert (e.file, e.line, e.key_path) == (str(path), line, "pe_ops.add.dtypes.int8")
    assert "dtype 'int8' has no format" in str(e)


def test_pe_op_dtype_override_on_a_unit_without_that_vector_mode(tmp_path):
    path, line = write(tmp_path, "nomode.yaml", """
        extends: mncore2
        name: nomode
        pe_ops:
          mul:
            dtypes:
              int32:
                unit: MAU  # <-
        """)
    e = load_error(path)
    assert (e.line, e.key_path) == (line, "pe_ops.mul.dtypes.int32.unit")
    assert "unit 'MAU' has no vector mode for int32; expected one of the units with one: ALU" in str(e)


def test_pe_op_dtype_override_rejects_unknown_keys(tmp_path):
    path, line = write(tmp_path, "extra.yaml", """
        extends: mncore2
        name: extra
        pe_ops:
          add:
            dtypes:
              int32:
                lanes: 4  # <-
        """)
    e = load_error(path)
    assert (e.line, e.key_path) == (line, "pe_ops.add.dtypes.int32.lanes")
    assert "unknown key 'lanes'; expected one of: unit, issues" in str(e)


def test_only_a_pe_stream_broadcast_names_subsets(tmp_path):
    """`subsets` (l2bmb@set) lives in an XFER broadcast's index: on a distribute, or on an MV's
    mode, nothing could carry it."""
    path, line = write(tmp_path, "subsets.yaml", """
        extends: mncore2
        name: subsets
        transfers:
          l2bm_to_l1bm:
            modes:
              distribute:
                subsets: true  # <-
        """)
    e = load_error(path)
    assert (e.line, e.key_path) == (line, "transfers.l2bm_to_l1bm.modes.distribute.subsets")
    assert "only a PE-stream broadcast names a subset of its children (l2bmb@set)" in str(e)


def test_a_subset_mask_must_fit_the_index_field(tmp_path):
    path, _ = write(tmp_path, "wide.yaml", """
        extends: mncore2
        name: wide
        levels:
          L1B: {count: 64}
        """)
    e = load_error(path)
    assert e.key_path == "transfers.l2bm_to_l1bm.modes.broadcast.subsets"
    assert "64 children per L2BM do not fit the index's bit mask (at most 63)" in str(e)
