"""add.py inside trace_scope: writes a Chrome/Perfetto trace of the host work and of the
simulated device's units (open it at https://ui.perfetto.dev).

    python examples/add_trace.py --device mncore2:auto --trace /tmp/add_trace.json
"""

import argparse
import tempfile

import torch
from mlsdk import Context, MNDevice, storage, trace_event, trace_scope


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="mncore2:auto")
    parser.add_argument("--trace", default=f"{tempfile.gettempdir()}/add_trace.json",
                        help="trace file; pass an empty string to disable tracing")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    context = Context(MNDevice(args.device))
    Context.switch_context(context)

    def add(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"out": inputs["x"] + inputs["y"]}

    sample = {"x": torch.ones(3, 4), "y": torch.ones(3, 4)}
    with trace_scope(args.trace or None):  # None disables tracing
        compiled_add = context.compile(add, sample, storage.path(tempfile.gettempdir()) / "add_trace",
                                       options={"float_dtype": "float"})
        with trace_event("run add"):
            result_on_cpu = compiled_add(sample)["out"].cpu()
    print(f"{result_on_cpu=}")
    assert torch.all(result_on_cpu == 2)


if __name__ == "__main__":
    main()
