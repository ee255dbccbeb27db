"""PFN's mnist.py classifier (1024 -> 256 -> 10, cross-entropy, MNCoreSGD(0.1, 0.9, 0.0), batch 64)
trained on the simulated chip, on a synthetic MNIST-shaped data set the script generates (no
download): ten classes, each a fixed random 32x32 "digit" pattern, every sample that pattern plus
noise. Forward, backward and the optimizer step run as one device program per batch; weights and
momentum stay on the device between steps; evaluation is a second compiled function.

    mnsim run examples/train_mnist.py                  # with the cycle report
    python examples/train_mnist.py --device mini:auto --epochs 1
"""

import argparse
import tempfile
from typing import Mapping

import torch
from mlsdk import Context, MNCoreSGD, MNDevice, set_buffer_name_in_optimizer, set_tensor_name_in_module, storage


class MNCoreClassifier(torch.nn.Module):
    """The model of PFN's mnist_common.py."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1 = torch.nn.Linear(1024, 256)
        self.linear2 = torch.nn.Linear(256, 10)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        x1 = self.linear1(x.reshape(x.size(0), -1))
        y = self.linear2(torch.nn.functional.relu(x1))
        loss = torch.nn.functional.cross_entropy(y, t)
        return {"loss": loss} if self.training else {"y": y, "loss": loss}


def synthetic_mnist(samples: int, batch_size: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """Batches of (x: (B, 1, 32, 32) normalised images, t: labels), like PFN's padded MNIST."""
    g = torch.Generator().manual_seed(0)  # the class patterns are the same for every split
    patterns = torch.rand(10, 1, 32, 32, generator=g) > 0.7
    g.manual_seed(seed)
    labels = torch.randint(0, 10, (samples,), generator=g)
    images = patterns[labels].float() + 0.8 * torch.randn(samples, 1, 32, 32, generator=g)
    images = (images - 0.1307) / 0.3081
    return [{"x": images[i:i + batch_size], "t": labels[i:i + batch_size]}
            for i in range(0, samples - batch_size + 1, batch_size)]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="mncore2:auto")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-samples", type=int, default=640)
    parser.add_argument("--outdir", default=str(storage.path(tempfile.gettempdir()) / "mnsim_mnist"))
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    batch_size, eval_batch_size = 64, 125
    train_loader = synthetic_mnist(args.train_samples, batch_size, seed=1)
    eval_loader = synthetic_mnist(500, eval_batch_size, seed=2)

    device = MNDevice(args.device)
    context = Context(device)
    Context.switch_context(context)

    model_with_loss_fn = MNCoreClassifier()
    model_with_loss_fn.train()
    set_tensor_name_in_module(model_with_loss_fn, "model_with_loss_fn")
    for p in model_with_loss_fn.parameters():
        context.register_param(p)

    optimizer = MNCoreSGD(model_with_loss_fn.parameters(), 0.1, 0.9, 0.0)
    set_buffer_name_in_optimizer(optimizer, "optimizer")
    context.register_optimizer_buffers(optimizer)

    def train_step(inp: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        optimizer.zero_grad()
        loss = model_with_loss_fn(inp["x"], inp["t"])["loss"]
        loss.backward()
        optimizer.step()
        return {"loss": loss}

    compiled_train_step = context.compile(train_step, train_loader[0], storage.path(args.outdir) / "train_step")
    first = None
    for epoch in range(args.epochs):
        loss = 0.0
        for i, sample in enumerate(train_loader):
            curr_loss = compiled_train_step(sample)["loss"].item()
            first = curr_loss if first is None else first
            loss += (curr_loss - loss) / (i + 1)
        print(f"epoch {epoch}, loss {loss:.4f}")
    context.synchronize()

    model_with_loss_fn.eval()

    def eval_step(inp: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        y = model_with_loss_fn(inp["x"], inp["t"])["y"]
        _, predicted = torch.max(y, 1)
        return {"correct": (predicted == inp["t"]).sum()}

    compiled_eval_step = context.compile(eval_step, eval_loader[0], storage.path(args.outdir) / "eval_step")
    correct = sum(compiled_eval_step(sample)["correct"].item() for sample in eval_loader)
    total = sum(len(sample["t"]) for sample in eval_loader)
    print(f"Correct: {correct} / {total}. Accuracy: {correct / total}")
    assert loss < first, f"the loss did not fall ({first:.4f} -> {loss:.4f})"


if __name__ == "__main__":
    main()
