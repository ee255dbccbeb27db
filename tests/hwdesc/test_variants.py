"""Variants change exactly what they override; descriptions survive a dump and reload."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import hwdesc
from hwdesc import dump, figures
from hwdesc.dump import flatten
from hwdesc.source import BUILTIN_DIR, UNSOURCED


def _overridden_keys(variant: str) -> set[str]:
    """The keys a variant file writes (sourced values count as one key), name and summary aside."""
    raw = yaml.safe_load((BUILTIN_DIR / f"{variant}.yaml").read_text())
    keys = set()
    for key in flatten(raw):
        for suffix in (".v", ".conf", ".src"):
            if key.endswith(suffix):
                key = key[: -len(suffix)]
        keys.add(key)
    return keys - {"extends", "name", "summary"}


@pytest.mark.parametrize("variant", ["mini", "mncore2_fastdram", "mncore2_2groups"])
def test_variant_changes_exactly_what_it_overrides(mncore2, variant):
    other = hwdesc.load(variant)
    written = {d.key for d in dump.diff(mncore2, other) if not d.derived}
    assert written == _overridden_keys(variant)


def test_fastdram_doubles_the_dram_paths_and_nothing_else(mncore2):
    fast = hwdesc.load("mncore2_fastdram")
    assert figures.dram_bandwidth_total(fast) == pytest.approx(2 * figures.dram_bandwidth_total(mncore2), rel=1e-6)
    assert figures.peak_flops(fast, "float32") == figures.peak_flops(mncore2, "float32")
    changed = {d.key for d in dump.diff(mncore2, fast) if d.derived}
    assert all(k.startswith(("bandwidth.dram", "bandwidth.l2bm_to_dram")) for k in changed)


def test_variant_provenance_points_at_the_variant_file(mncore2):
    two = hwdesc.load("mncore2_2groups")
    prov = two.provenance("levels", "Group", "count")
    assert prov.conf == "variant" and Path(prov.location.file).name == "mncore2_2groups.yaml"
    assert Path(two.provenance("clock_hz").location.file).name == "mncore2.yaml"
    assert Path(hwdesc.load("mini").provenance("levels", "PE", "count").location.file).name == "mncore2.yaml"
    mini_l1b = hwdesc.load("mini").provenance("levels", "L1B", "count")
    assert mini_l1b.conf == UNSOURCED and Path(mini_l1b.location.file).name == "mini.yaml"


@pytest.mark.parametrize("name", hwdesc.names())
def test_dump_and_reload_round_trip(tmp_path, name):
    original = hwdesc.load(name)
    path = tmp_path / f"{name}_resolved.yaml"
    path.write_text(dump.dump(original))
    again = hwdesc.load(path)
    assert again == original
    assert {k: (p.conf, p.src) for k, p in again.provenance_table.items()} == \
           {k: (p.conf, p.src) for k, p in original.provenance_table.items()}
    assert dump.dump(again).split("\n", 1)[1] == dump.dump(original).split("\n", 1)[1]


def test_every_hardware_fact_of_mncore2_has_a_source(mncore2):
    table = mncore2.provenance_table
    assert len(table) > 150
    unsourced = [k for k, p in table.items() if p.conf == UNSOURCED]
    assert unsourced == []
    assert all(p.src.strip() for p in table.values())


def test_descriptions_are_immutable(mncore2):
    with pytest.raises(Exception):
        mncore2.clock_hz = 1  # type: ignore[misc]
    with pytest.raises(TypeError, match="immutable"):
        mncore2.levels["PE"] = None  # type: ignore[index]


def test_builtin_names_lists_the_shipped_files():
    assert hwdesc.names()[0] == "mncore2"
    assert {"mini", "mncore2_fastdram", "mncore2_2groups"} <= set(hwdesc.names())
