"""A producer -> consumer chain compiled without io_spec_constraints.

Each function gets the layouts that suit it, so the producer's output is not laid out as the
consumer's input wants: the runtime converts it with a DRAM-to-DRAM program (no host round
trip) and records that conversion's cycles, with advice on the constraint that would avoid it.
Compare io_spec_constraints.py, where the same hand-over is a relocation (nothing moves).

    python examples/chain_conversion.py --device mncore2:auto
"""

import argparse
import tempfile

import torch
from mlsdk import Context, MNDevice, storage

TensorDict = dict[str, torch.Tensor]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="mncore2:auto")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    context = Context(MNDevice(args.device))
    tmp = storage.path(tempfile.gettempdir())
    options = {"float_dtype": "float"}

    def producer(inputs: TensorDict) -> TensorDict:
        return {"scores": inputs["q"] @ inputs["k"].T}

    def consumer(inputs: TensorDict) -> TensorDict:
        return {"probs": torch.softmax(inputs["scores"], dim=-1)}

    q, k = torch.randn(64, 32), torch.randn(128, 32)
    compiled_producer = context.compile(producer, {"q": q, "k": k}, tmp / "chain_producer", options=options)
    compiled_consumer = context.compile(consumer, {"scores": q @ k.T}, tmp / "chain_consumer", options=options)

    scores = compiled_producer({"q": q, "k": k})
    probs = compiled_consumer(scores)["probs"].cpu()

    expected = torch.softmax(q @ k.T, dim=-1)
    assert torch.allclose(probs, expected, atol=1e-5)
    print("producer -> consumer chain succeeded")
    for binding in context.session.bindings:
        if binding.function == "consumer":
            print(f"consumer input {binding.input!r}: {binding.path}, {binding.cycles} cycles")
            if binding.advice:
                print(f"  advice: {binding.advice}")


if __name__ == "__main__":
    main()
