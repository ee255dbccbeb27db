"""Explicit data transfers: fill pre-allocated input proxies and a registered weight by hand.

    python examples/explicit_data_transfer_api.py --device mncore2:auto
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
    context = Context(MNDevice(args.device))
    Context.switch_context(context)
    set_tensor_name_in_module(model, "model")
    for p in model.parameters():
        context.register_param(p)

    def infer(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"out": model(inputs["x"])}

    sample = {"x": torch.zeros(4, 4)}
    compiled_infer = context.compile(infer, sample, storage.path(tempfile.gettempdir()) / "explicit_data_transfer",
                                     options={"float_dtype": "float"})

    # Upload the input into a buffer allocated in the layout the program reads.
    inputs = compiled_infer.allocate_input_proxy()
    inputs["x"].load_from(torch.ones(4, 4), clone=False)
    # Change a registered weight on the device only (the host tensor is updated by synchronize()).
    new_bias = torch.full((4,), 0.5)
    context.get_registered_value_proxy(model.bias).load_from(new_bias)

    result = compiled_infer(inputs)["out"].cpu()
    print(result)
    expected = torch.ones(4, 4) @ model.weight.detach().T + new_bias
    assert torch.allclose(result, expected, atol=1e-5)
    context.synchronize()
    assert torch.equal(model.bias.detach(), new_bias)


if __name__ == "__main__":
    main()
