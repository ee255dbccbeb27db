"""ResNet-18 inference (batch 1, eval-mode batch norm) on the simulated chip, its parameters and
buffers registered (they stay on the device), with the cycles of the call and its costliest ops.
The model is torchvision's architecture, written out here (torchvision has no CPU wheel on every
machine), with random weights.

    python examples/resnet18.py --size 224 --timing      # the cycles only (timing-only simulation)
    python examples/resnet18.py --size 64                # values too, checked against torch
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from mlsdk import Context, MNDevice, set_tensor_name_in_module
from mlsdk.report import op_cycles


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        blocks, cin = [], 64
        for cout, stride in [(64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)]:
            blocks.append(BasicBlock(cin, cout, stride))
            cin = cout
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = self.layers(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="mncore2:auto")
    parser.add_argument("--size", type=int, default=64, help="image height and width")
    parser.add_argument("--timing", action="store_true", help="timing-only simulation (no values)")
    parser.add_argument("--top", type=int, default=10, help="ops to list, costliest first")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = ResNet18().eval()
    ctx = Context(MNDevice(args.device))
    set_tensor_name_in_module(model, "resnet18")
    for p in model.parameters():
        ctx.register_param(p)
    for b in model.buffers():
        ctx.register_buffer(b)
    x = torch.randn(1, 3, args.size, args.size)
    options = {"simulation_mode": "timing"} if args.timing else {}
    infer = ctx.compile(lambda d: {"y": model(d["x"])}, {"x": x}, None, options=options)
    out = infer({"x": x})
    if not args.timing:
        with torch.no_grad():
            error = (out["y"].cpu() - model(x)).abs().max().item()
        print(f"largest difference from torch: {error:.2e}")
    print(f"ResNet-18 at {args.size}x{args.size} on {args.device}: {infer.last_cycles:,} cycles")
    call = ctx.session.calls[-1].runs[-1]  # the call itself (the runs before it upload the parameters)
    for name, cycles, _ in sorted(op_cycles(call.stats, call.labels), key=lambda r: -r[1])[:args.top]:
        print(f"{cycles:>12,}  {name}")


if __name__ == "__main__":
    main()
