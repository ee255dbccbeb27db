"""Add two tensors on the (simulated) MN-Core 2: the smallest complete MLSDK program.

    python examples/add.py --device mncore2:auto

The codegen_dir (add_two_tensors in the temporary directory) is what load_codegen_dir.py reloads.
"""

import argparse
import tempfile

import torch
from mlsdk import CacheOptions, Context, MNDevice, storage


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="mncore2:auto")
    return parser.parse_args()


def add(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"out": inputs["x"] + inputs["y"]}


def main() -> None:
    args = parse_args()
    context = Context(MNDevice(args.device))
    Context.switch_context(context)

    sample = {"x": torch.ones(3, 4), "y": torch.ones(3, 4)}
    compiled_add = context.compile(
        add,
        sample,
        storage.path(tempfile.gettempdir()) / "add_two_tensors",
        options={"float_dtype": "float"},
        cache_options=CacheOptions(f"{tempfile.gettempdir()}/mnsim_cache"),
    )
    result_on_cpu = compiled_add(sample)["out"].cpu()
    print(f"{result_on_cpu=}")
    assert torch.all(result_on_cpu == 2)


if __name__ == "__main__":
    main()
