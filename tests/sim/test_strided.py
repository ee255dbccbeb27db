"""sim.strided.copy_view: the host image copies give numpy's assignment, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from sim.strided import BLOCK_ELEMENTS, PARALLEL_ELEMENTS, _merged_dims, _unit_strides_inside, copy_view


def permuted_view(base: np.ndarray, shape: tuple[int, ...], order: list[int], start: int) -> np.ndarray:
    """A view of `base` indexed like `shape`, its dimensions laid out in `order` (innermost last)."""
    strides = [0] * len(shape)
    step = 1
    for axis in reversed(order):
        strides[axis] = step * base.itemsize
        step *= shape[axis]
    return as_strided(base[start:], shape=shape, strides=strides)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("memory_is_dst", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_a_copy_between_permuted_views_equals_numpys(dtype, memory_is_dst, seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(1, 6, size=int(rng.integers(1, 6))))
    size = int(np.prod(shape))
    start_src, start_dst = int(rng.integers(0, 3)), int(rng.integers(0, 3))
    src_base = rng.integers(0, np.iinfo(dtype).max, size=size + 3, dtype=dtype)
    src = permuted_view(src_base, shape, list(rng.permutation(len(shape))), start_src)
    expected_base = rng.integers(0, np.iinfo(dtype).max, size=size + 3, dtype=dtype)
    got_base = expected_base.copy()
    order = list(rng.permutation(len(shape)))
    permuted_view(expected_base, shape, order, start_dst)[...] = src
    copy_view(got_base, permuted_view(got_base, shape, order, start_dst), src_base, src, memory_is_dst=memory_is_dst)
    np.testing.assert_array_equal(got_base, expected_base)  # the elements outside the view untouched too


def test_a_broadcast_source_fills_every_copy():
    """scatter's broadcast copies: a source dimension of stride 0."""
    src_base = np.arange(12, dtype=np.uint32)
    dst_base = np.zeros(36, dtype=np.uint32)
    dst = dst_base.reshape(3, 4, 3)
    copy_view(dst_base, dst, src_base, src_base.reshape(3, 4, 1), memory_is_dst=True)
    np.testing.assert_array_equal(dst, np.broadcast_to(src_base.reshape(3, 4, 1), (3, 4, 3)))


def test_word_pairs_contiguous_on_both_sides_move_as_one_wide_word():
    """A DRAM image of float32 pairs (a long word of two words) against a tensor whose columns
    pair up the same way: the innermost pair merges into one 64-bit element per step."""
    tensor = np.arange(8 * 6, dtype=np.uint32).reshape(8, 6)
    image = np.zeros(48, dtype=np.uint32)
    view = image.reshape(3, 8, 2).transpose(1, 0, 2).reshape(8, 3, 2)  # columns 2c, 2c+1 side by side
    copy_view(image, view, tensor.reshape(-1), tensor.reshape(8, 3, 2), memory_is_dst=True)
    np.testing.assert_array_equal(image.reshape(3, 8, 2), tensor.reshape(8, 3, 2).transpose(1, 0, 2))


def test_the_loops_follow_the_memory_side():
    """Read back into a row-major tensor, the innermost loop runs along the image (the source)."""
    image = np.zeros(4 * 8, dtype=np.uint32)
    tensor = np.zeros(4 * 8, dtype=np.uint32)
    src = image.reshape(8, 4).T  # the tensor's rows are the image's columns
    dims = _merged_dims(tensor.reshape(4, 8), src, key=1)
    assert dims[0] == [8, 1, 4]  # tensor stride 8 (a column), image stride 1
    assert _merged_dims(tensor.reshape(4, 8), src, key=0)[0] == [1, 4, 8]


@pytest.mark.parametrize("memory_is_dst", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_a_copy_large_enough_to_share_between_threads_equals_numpys(memory_is_dst, seed):
    """Past PARALLEL_ELEMENTS the threads share the copy in blocks: interleaved images (a DRAM
    image's digits) and one unbroken run of more than a block."""
    rng = np.random.default_rng(seed)
    shape = (4, 2, 8, 8, 16, 9, 2, 3)
    size = int(np.prod(shape))
    assert size >= PARALLEL_ELEMENTS
    src_base = rng.integers(0, 2 ** 32, size=size + 1, dtype=np.uint32)
    src = permuted_view(src_base, shape, list(rng.permutation(len(shape))), 1)
    expected_base = rng.integers(0, 2 ** 32, size=size + 2, dtype=np.uint32)
    got_base = expected_base.copy()
    order = list(rng.permutation(len(shape)))
    permuted_view(expected_base, shape, order, 2)[...] = src
    copy_view(got_base, permuted_view(got_base, shape, order, 2), src_base, src, memory_is_dst=memory_is_dst)
    np.testing.assert_array_equal(got_base, expected_base)
    run = np.zeros(4 * BLOCK_ELEMENTS * 9, dtype=np.uint32)  # 9 is odd: no 64-bit pairs, one run
    copy_view(run, run, src_base, src_base[:run.size], memory_is_dst=True)
    np.testing.assert_array_equal(run, src_base[:run.size])


def test_writes_are_innermost_then_reads():
    """The loop order: the destination's contiguous dimension innermost, then the source's."""
    dims = [[1, 88064, 4], [4, 16, 2], [8, 352256, 8], [512, 1, 16]]  # an upload: memory side first
    assert _unit_strides_inside(dims) == [[1, 88064, 4], [512, 1, 16], [4, 16, 2], [8, 352256, 8]]
    download = [[s, d, n] for d, s, n in dims]
    assert _unit_strides_inside(download) == [[1, 512, 16], [88064, 1, 4], [16, 4, 2], [352256, 8, 8]]


def test_mismatched_dtypes_and_foreign_views_are_refused():
    a = np.zeros(8, dtype=np.uint32)
    with pytest.raises(TypeError, match="one dtype"):
        copy_view(a, a, np.zeros(8, dtype=np.uint16), np.zeros(8, dtype=np.uint16), memory_is_dst=True)
    with pytest.raises(ValueError, match="does not lie in its base"):
        copy_view(a, np.zeros(8, dtype=np.uint32), a, a, memory_is_dst=True)
    overhang = as_strided(a[4:], shape=(8,), strides=(a.itemsize,))  # starts inside, ends past the end
    with pytest.raises(ValueError, match="does not lie in its base"):
        copy_view(a, overhang, a, a, memory_is_dst=True)
