"""Run a compiled function again from its codegen_dir, without the Python function or a recompile.

    python examples/add.py --device mncore2:auto              # writes add_two_tensors
    python examples/load_codegen_dir.py --device mncore2:auto
"""

import argparse
import tempfile

import torch
from mlsdk import Context, MNDevice, storage


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="mncore2:auto")
    parser.add_argument("--codegen-dir", default=f"{tempfile.gettempdir()}/add_two_tensors")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    context = Context(MNDevice(args.device))
    Context.switch_context(context)

    loaded_add = context.load_codegen_dir(storage.path(args.codegen_dir))
    inputs = {"x": torch.ones(3, 4), "y": torch.ones(3, 4)}
    result_on_cpu = loaded_add(inputs)["out"].cpu()
    print(f"Result from loaded function: {result_on_cpu=}")
    assert torch.all(result_on_cpu == 2)


if __name__ == "__main__":
    main()
