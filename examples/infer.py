"""Inference with a registered nn.Linear: the weights stay on the device between calls.

    python examples/infer.py --device mncore2:auto
"""

import argparse
import tempfile

import torch
from mlsdk import Context, MNDevice, set_tensor_name_in_module, storage


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="mncore2:auto")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    model.eval()
    context = Context(MNDevice(args.device))
    Context.switch_context(context)
    set_tensor_name_in_module(model, "model")
    for p in model.parameters():
        context.register_param(p)
    for b in model.buffers():
        context.register_buffer(b)

    def infer(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"out": model(inputs["x"])}

    sample = {"x": torch.ones(4, 4)}
    compiled_infer = context.compile(infer, sample, storage.path(tempfile.gettempdir()) / "infer",
                                     options={"float_dtype": "mixed"})
    result = compiled_infer(sample)["out"].cpu()
    print(result)
    with torch.no_grad():
        expected = model(sample["x"])
    # mixed: the product runs in MN-Core's half (1-6-9) with float accumulation.
    assert torch.allclose(result, expected, atol=1e-2 * float(expected.abs().max()))


if __name__ == "__main__":
    main()
