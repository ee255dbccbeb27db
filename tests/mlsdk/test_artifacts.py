"""A codegen_dir under damage: every missing, truncated, bit-flipped, replaced or foreign file,
and a path that is no directory, raises ArtifactError naming the file; the Context stays usable."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from compiler.artifact import FILES
from mlsdk import ArtifactError, Context, MLSDKError, MNDevice

X = torch.arange(32.0).reshape(4, 8)


def fn(d):
    return {"y": d["x"] * 2 + 1}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("artifact") / "fn"
    Context(MNDevice("mini:auto")).compile(fn, {"x": X}, d)
    return d


@pytest.fixture
def copy(saved, tmp_path) -> Path:
    d = tmp_path / "fn"
    shutil.copytree(saved, d)
    return d


def load(d: Path):
    return Context(MNDevice("mini:auto")).load_codegen_dir(d)


def test_an_intact_codegen_dir_loads_and_runs(copy):
    assert sorted(p.name for p in copy.iterdir()) == sorted(FILES)
    assert torch.equal(load(copy)({"x": X})["y"].cpu(), X * 2 + 1)


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def flip_bit(at: float):
    def damage(path: Path) -> None:
        data = bytearray(path.read_bytes())
        i = min(len(data) - 1, int(len(data) * at))
        data[i] ^= 0x10
        path.write_bytes(bytes(data))
    return damage


def to_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def remove(path: Path) -> None:
    path.unlink()


DAMAGE = {"missing": remove, "truncated": truncate, "flipped at the start": flip_bit(0.0),
          "flipped in the middle": flip_bit(0.5), "flipped at the end": flip_bit(1.0), "a directory": to_directory}


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("name", FILES)
def test_every_damaged_file_is_named(copy, name, damage):
    DAMAGE[damage](copy / name)
    with pytest.raises(ArtifactError) as e:
        load(copy)
    assert name in str(e.value), str(e.value)
    assert isinstance(e.value, MLSDKError) and isinstance(e.value, OSError)


@pytest.mark.parametrize("name", FILES)
def test_a_file_from_another_codegen_dir_is_named(copy, tmp_path, name):
    other = tmp_path / "other"
    Context(MNDevice("mini:auto")).compile(lambda d: {"y": d["x"] - 3}, {"x": X}, other)
    shutil.copy(other / name, copy / name)
    if name in ("chip.yaml",):  # the same chip: the same description, byte for byte
        assert torch.equal(load(copy)({"x": X})["y"].cpu(), X * 2 + 1)
        return
    with pytest.raises(ArtifactError, match=name.replace(".", r"\.")):
        load(copy)


def test_a_foreign_file_and_non_directories(copy, tmp_path):
    (copy / "notes.txt").write_text("mine")
    with pytest.raises(ArtifactError, match=r"notes\.txt is not part of an mnsim codegen_dir"):
        load(copy)
    with pytest.raises(ArtifactError, match=r"holds notes\.txt, which mnsim did not write"):
        Context(MNDevice("mini:auto")).compile(fn, {"x": X}, copy)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ArtifactError, match=r"codegen_dir .*file is a file, not a directory"):
        load(a_file)
    ctx = Context(MNDevice("mini:auto"))
    with pytest.raises(ArtifactError, match=r"codegen_dir .*file is a file, not a directory"):
        ctx.compile(fn, {"x": X}, a_file)
    with pytest.raises(ArtifactError, match="no codegen_dir at"):
        load(tmp_path / "nothing")
    assert torch.equal(ctx.compile(fn, {"x": X}, tmp_path / "fresh")({"x": X})["y"].cpu(), X * 2 + 1), \
        "the Context stays usable"


def test_recompiling_into_a_codegen_dir_replaces_it(copy):
    Context(MNDevice("mini:auto")).compile(lambda d: {"y": d["x"] - 3}, {"x": X}, copy)
    assert torch.equal(load(copy)({"x": X})["y"].cpu(), X - 3)
