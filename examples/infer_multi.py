"""Two models in one Context: their registered weights are told apart by name.

    python examples/infer_multi.py --device mncore2:auto
"""

import argparse
import tempfile

import torch
from mlsdk import Context, MNDevice, set_tensor_name_in_module, storage


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="mncore2:auto")
    return parser.parse_args()


def constant_linear(value: float) -> torch.nn.Linear:
    model = torch.nn.Linear(4, 4, bias=False)
    torch.nn.init.constant_(model.weight, value)
    return model


def main() -> None:
    args = parse_args()
    context = Context(MNDevice(args.device))
    Context.switch_context(context)
    model0, model1 = constant_linear(1.0), constant_linear(2.0)
    for prefix, model in (("model0", model0), ("model1", model1)):
        set_tensor_name_in_module(model, prefix)  # the names keep the two models' weights apart
        for p in model.parameters():
            context.register_param(p)

    def infer0(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"out": model0(inputs["x"])}

    def infer1(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"out": model1(inputs["x"])}

    sample = {"x": torch.ones(4, 4)}
    tmp = storage.path(tempfile.gettempdir())
    compiled0 = context.compile(infer0, sample, tmp / "infer_multi0", options={"float_dtype": "float"})
    compiled1 = context.compile(infer1, sample, tmp / "infer_multi1", options={"float_dtype": "float"})
    out0 = compiled0(sample)["out"].cpu()
    out1 = compiled1(sample)["out"].cpu()
    assert torch.all(out0 == 4), out0
    assert torch.all(out1 == 8), out1
    print("model0 -> 4, model1 -> 8")


if __name__ == "__main__":
    main()
