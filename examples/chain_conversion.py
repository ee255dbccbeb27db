"""A producer -> consumer chain, compiled without io_spec_constraints or with the advised one.

Each function gets the layouts that suit it, so the producer's output is not laid out as the
consumer's input wants: the runtime converts it with a DRAM-to-DRAM program (no host round
trip). The report measures the whole chain each way, both simulated: the producer compiled for
the consumer's layout (relocation) against its own layout plus the conversion, and prints
advice when the constraint saves cycles. `--follow-advice` compiles the producer with that
constraint; the two runs' chain cycles differ by what the advice said.

The consumer applies a sigmoid to each score, which it reads in any layout: constrained, the
product writes the scores where the consumer reads them. A softmax instead wants each row inside
a PE, which a product cannot write: the constrained producer relays its output itself, as the
conversion would, relocation saves nothing and the report gives no advice.

    python examples/chain_conversion.py --device mncore2:auto
    python examples/chain_conversion.py --device mncore2:auto --follow-advice
"""

import argparse
import tempfile

import torch
from mlsdk import Context, MNDevice, storage

TensorDict = dict[str, torch.Tensor]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="mncore2:auto")
    parser.add_argument("--follow-advice", action="store_true",
                        help="compile the producer with io_spec_constraints for the consumer's input layout")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    context = Context(MNDevice(args.device))
    tmp = storage.path(tempfile.gettempdir())
    options = {"float_dtype": "float"}

    def producer(inputs: TensorDict) -> TensorDict:
        return {"scores": inputs["q"] @ inputs["k"].T}

    def consumer(inputs: TensorDict) -> TensorDict:
        return {"probs": torch.sigmoid(inputs["scores"])}

    q, k = torch.randn(64, 32), torch.randn(128, 32)
    compiled_consumer = context.compile(consumer, {"scores": q @ k.T}, tmp / "chain_consumer", options=options)
    constraints = {"scores": compiled_consumer.input_specs["scores"]} if args.follow_advice else None
    compiled_producer = context.compile(producer, {"q": q, "k": k}, tmp / "chain_producer", options=options,
                                        io_spec_constraints=constraints)

    scores = compiled_producer({"q": q, "k": k})
    probs = compiled_consumer(scores)["probs"].cpu()

    expected = torch.sigmoid(q @ k.T)
    assert torch.allclose(probs, expected, atol=1e-5)
    print("producer -> consumer chain succeeded")
    report = context.report()  # a script reads its own figures
    for binding in report.bindings:
        if binding.producer == "producer.scores":
            print(f"{binding.consumer} from {binding.producer}: {binding.path} ({binding.cycles:,} cycles)")
    for row in report.handovers:
        print(f"whole chain {row.producer} -> {', '.join(row.consumers)}: {row.as_run:,} cycles as run, "
              f"{row.with_constraint:,} relocated, {row.without_constraint:,} converted")
        if row.advice:
            print(f"  advice: {row.advice}")
    print(f"chain: {compiled_producer.last_call.cycles_with_bindings + compiled_consumer.last_call.cycles_with_bindings:,} "
          "cycles (calls and their input bindings)")


if __name__ == "__main__":
    main()
