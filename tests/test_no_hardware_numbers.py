"""Simulator, compiler and API code hold no hardware numbers: those live in hwdesc/*.yaml.

Every integer literal of 4 or more in sim/, compiler/, runtime/ and mlsdk/ must be on the allowlist below,
with the reason it is not a fact about the chip. `sim/isa.py` (the instruction encoding: field
positions and opcodes), the plots (figure geometry) and the sweep's model suite (model sizes)
are exempt, and so are the published constants of the device's random generator.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "compiler", "runtime", "mlsdk")
# plots: figure and font sizes, percent scales; the suite: the sizes of its models
# Threefry's generator (compiler/frontend/random.py): its published rotations, rounds and key-schedule
# constant, and the 32-bit words it computes on
EXEMPT = {"sim/isa.py", "mlsdk/plots.py", "mlsdk/sweep/plots.py", "mlsdk/sweep/suite.py", "compiler/frontend/random.py"}
ALLOWED = {
    ("compiler/frontend/legalize.py", 10): "torch.round's decimals are decimal digits (10 ** decimals, torch's rule)",
    ("sim/vector.py", 0xFFFFFFFF): "masks an int64 instruction field to the 32 bits of a float32 or int32 immediate",
    ("sim/numerics.py", 8): "IEEE binary32 exponent width: numpy's float32, the host type PEs compute in",
    ("sim/numerics.py", 23): "IEEE binary32 mantissa width",
    ("sim/numerics.py", 6): "most Newton steps erfinv takes (a numerical method's bound, not the chip's)",
    ("sim/numerics.py", 32): "bits of an int32 word (two's complement, as torch's int32)",
    ("compiler/dtypes.py", 32): "bits of an int32 word (torch's int32, the IR's integer type)",
    ("compiler/frontend/above_autograd.py", 25): "torch's row count past which cdist computes through a product (torch's rule)",
    ("compiler/planner/rewrite.py", 22): "weights of a depthwise convolution run dense, as a shift (1 << 22; planner heuristic)",
    ("compiler/frontend/legalize_sort.py", 16): "topk rounds of selection before sorting instead (compile policy)",
    ("compiler/frontend/legalize_sort.py", 20): "pairs a sort may compare, as a shift (1 << 20; compile policy)",
    ("sim/params.py", 8): "bits per byte",
    ("compiler/emit.py", 1536): "host bytes one instruction takes at the peak of building and simulating (host policy)",
    ("compiler/emit.py", 30): "a GiB is 2 ** 30 bytes (the host-memory refusal's message)",
    ("compiler/hostmem.py", 1024): "bytes per kB of /proc/meminfo's figures",
    ("compiler/transfer/gather.py", 1024): "host bytes an element takes when a gather is matched element by element (host policy)",
    ("compiler/transfer/gather.py", 30): "a GiB is 2 ** 30 bytes (the element-match refusal's message)",
    ("mlsdk/context.py", 4): "Python frames from a warning up to the user's compile() call (stacklevel)",
    ("sim/program.py", 4): "bindings kept per program with their timing (host-side cache size)",
    ("sim/params.py", 32): "lru_cache size; WORD_BITS (mnsim's memory arrays are uint32, from_hw rejects other sizes)",
    ("sim/accesses.py", 6): "columns of the hazard check's access table (memory, first, last, path, reduces, on ALU)",
    ("sim/machine.py", 16): "DRAM rows grow by at least 1 << 16 words (growth policy)",
    ("sim/mau.py", 20): "multiply-adds of a MATMUL before its products are split between threads (1 << 20, host policy)",
    ("sim/vector.py", 18): "elements a float VOP computes before its PEs are split between threads (1 << 18, host policy)",
    ("sim/functional.py", 18): "words a run of Group-local moves moves before threads split it (1 << 18, host policy)",
    ("sim/replicas.py", 12): "plans of replica write-outs a program keeps (1 << 12, host-side cache size)",
    ("sim/strided.py", 18): "elements a host copy has before it is shared between threads (1 << 18, host policy)",
    ("sim/strided.py", 13): "elements of one thread's block of a host copy (1 << 13, host cache policy)",
    ("runtime/host_images.py", 28): "bytes of host images the device keeps for reuse (1 << 28, host policy)",
    ("runtime/host_outputs.py", 20): "bytes from which a downloaded tensor's array is recycled (1 << 20, host policy)",
    ("runtime/host_outputs.py", 28): "bytes of downloaded tensors' arrays the device keeps for reuse (1 << 28, host policy)",
    ("sim/mau.py", 16): "longest K-slice per PE the simulator multiplies in its own loop rather than BLAS (host speed)",
    ("sim/mau.py", 5): "dimensions of an operand viewed per unit of MABs ([unit, MAB, PE, rows, columns])",
    ("sim/mau.py", 4): "K steps the loop's multiply adds to an output row per pass (its body is written for four; host speed)",
    ("compiler/layout/candidates.py", 24): "how many candidates to return (planner budget)",
    ("compiler/layout/candidates.py", 16): "PFN's educational-compiler convention: tensors of <= 16 elements stay in DRAM 0",
    ("compiler/layout/candidates.py", 512): "lru_cache size",
    ("compiler/layout/cli.py", 8): "copies shown by `layout show --where`",
    ("compiler/layout/hostio.py", 16): "numpy unsigned type per element width",
    ("compiler/layout/hostio.py", 512): "host-side cache budget of element maps, MiB (not a chip number)",
    ("compiler/layout/hostio.py", 20): "MiB as a shift (512 << 20 bytes)",
    ("compiler/transfer/gather.py", 512): "MiB of gather runs the compile-time cache keeps (host policy)",
    ("compiler/transfer/gather.py", 20): "MiB as a shift (512 << 20 bytes)",
    ("runtime/memory.py", 20): "MiB as a shift (1 << 20 bytes), how a DeviceMemoryError states sizes",
    ("compiler/layout/hostio.py", 32): "numpy unsigned type per element width",
    ("compiler/layout/hostio.py", 64): "numpy unsigned type per element width",
    ("compiler/layout/hostio.py", 8): "bits per byte",
    ("compiler/layout/hostio.py", 4096): "strided blocks per transfer past which an element map is cheaper (host policy)",
    ("compiler/layout/hostio.py", 1024): "block lists of layouts kept for reuse (host-side cache size)",
    ("compiler/layout/placement.py", 24): "elements beyond 1 << 24 are checked algebraically only",
    ("compiler/layout/placement.py", 4): "the inverse map may be 4x the exact-check limit",
    ("compiler/layout/placement.py", 4096): "placements kept for reuse (compile-time cache size)",
    ("mlsdk/cli.py", 120): "console width when writing to a pipe",
    ("mlsdk/commands.py", 140): "console width of a text report written to a file",
    ("mlsdk/render.py", 40): "runs listed in a text report before it shows only the longest",
    ("mlsdk/trace.py", 100): "first Chrome-trace process id of device runs (the host is 1)",
    ("mlsdk/render.py", 100): "percent",
    ("mlsdk/render.py", 4): "rounding of utilisation and microseconds in CSV",
    ("mlsdk/render.py", 6): "rounding of utilisation and microseconds in CSV",
    ("mlsdk/report.py", 200): "slices of the utilisation timeline (plot resolution)",
    ("mlsdk/report.py", 4): "rounding of seconds and fractions in JSON",
    ("compiler/transfer/staging.py", 64): "lru_cache size",
    ("compiler/transfer/host.py", 256): "lru_cache size",
    ("compiler/transfer/gather.py", 5): "fields of a run record (dst, group, src, n, buffer)",
    ("compiler/transfer/gather.py", 16): "bytes of an element map's digest (a compile-time cache key)",
    ("compiler/transfer/gather.py", 256): "conversions kept for reuse (compile-time cache size)",
    ("compiler/transfer/staging.py", 2048): "stagings kept for reuse (compile-time cache size)",
    ("compiler/layout/layout.py", 8192): "canonical layouts kept for reuse (compile-time cache size)",
    ("compiler/convert.py", 5): "completion-tag number (software convention)",
    ("compiler/convert.py", 6): "completion-tag number (software convention)",
    ("compiler/transfer/host.py", 7): "completion-tag number of host transfer programs (software convention)",
    ("compiler/transfer/host.py", 8): "completion-tag number (software convention)",
    ("compiler/transfer/host.py", 9): "completion-tag number (software convention)",
    ("compiler/transfer/host.py", 10): "completion-tag number (software convention)",
    ("compiler/compile.py", 4): "digits kept of the compile time in seconds",
    ("compiler/dtypes.py", 31): "the range of int32, the IR's integer dtype (torch's int32)",
    ("compiler/ir.py", 4): "convolutions take (N, C, H, W) tensors",
    ("compiler/kernels/context.py", 4): "completion-tag numbers: which program uses which tag is a software convention",
    ("compiler/kernels/context.py", 5): "completion-tag number (software convention)",
    ("compiler/kernels/context.py", 6): "completion-tag number (software convention)",
    ("compiler/kernels/loops.py", 4096): "planner budget: unrolling beyond this means a pathological layout pairing",
    ("compiler/kernels/matmul.py", 32): "undominated tilings per product the planner times (compile-time budget)",
    ("compiler/kernels/matmul.py", 4): "tilings whose operand layouts a product offers its producers (compile-time budget)",
    ("compiler/kernels/matmul.py", 256): "lru_cache size",
    ("compiler/kernels/stationary.py", 8): "A's ring depth in a B-stationary product (compile-time choice)",
    ("compiler/kernels/matmul.py", 8): "most rounds a B-stationary tiling is tried with (compile-time budget)",
    ("compiler/kernels/matmul.py", 9): "STATIONARY_PADDING, 9 / 8: the row padding a B-stationary tiling may add for whole MAU rows per round (compile-time choice)",
    ("compiler/kernels/stationary.py", 4): "L2BM and L1BM quartered for a B-stationary product's last round: its ring and legs in "
                                         "one half, the earlier rounds' uploads in two quarters",
    ("compiler/kernels/conv.py", 4): "tilings whose B reads a device weight by block copies the planner times (compile-time budget)",
    ("compiler/kernels/conv.py", 12): "tilings asked for per direct form of a convolution (compile-time budget)",
    ("compiler/planner/rewrite.py", 4): "when a reduction is split: reduced elements per PE (planner heuristic)",
    ("compiler/planner/rewrite.py", 8): "when a reduction is split: PEs per kept element; parts a whole one needs (planner heuristics)",
    ("compiler/planner/search.py", 6): "candidate layouts timed per node (compile-time budget)",
    ("mlsdk/context.py", 24): "hex digits of a cache key",
    ("compiler/transfer/separable.py", 8_000_000): "runs a gather may list (compile-time budget of host memory)",
    ("mlsdk/device.py", 8): "MLSDK's device-name grammar: mncore2:0 .. mncore2:7",
    ("mlsdk/sweep/points.py", 1_000_000): "largest grid a sweep runs whole (host policy)",
    ("compiler/planner/search.py", 1_000_000): "instructions a candidate may emit to be timed once another is (compile-time budget)",
    ("compiler/planner/search.py", 8): "convolution candidates timed in a row without bettering the best before the rest are left "
                                       "(compile-time budget)",
    ("mlsdk/sweep/store.py", 24): "hex digits of a row key",
    ("mlsdk/sweep/table.py", 30): "rows of the summary's point table",
    ("mlsdk/sweep/table.py", 10): "failed points listed with their reason",
    ("mlsdk/sweep/workloads.py", 20): "hex digits of a workload hash",
    ("mlsdk/sweep/workloads.py", 6): "last lines of a failed script's output kept in its row",
}


def _literals(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) >= 4:
            yield node.lineno, node.value


def test_no_hardware_numbers_in_code():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in EXEMPT:
                continue
            for line, value in _literals(path):
                if (rel, value) not in ALLOWED:
                    found.append(f"{rel}:{line}: {value}")
    assert not found, "numbers that belong in hwdesc/*.yaml (or on the allowlist, with a reason):\n" + "\n".join(found)


def test_the_check_finds_a_planted_number(tmp_path):
    planted = tmp_path / "x.py"
    planted.write_text("RATE = 16  # LW per cycle\nclock = 750_000_000\nsmall = 2\n")
    assert [v for _, v in _literals(planted)] == [16, 750_000_000]
