"""ResNet-18 or ResNet-50 inference (batch 1, eval-mode batch norm) on the simulated chip, its
parameters and buffers registered (they stay on the device), with the cycles of the call and its
costliest ops. The models are torchvision's architectures, written out here (torchvision has no
CPU wheel on every machine), with random weights.

    python examples/resnet.py --size 224 --timing             # ResNet-18's cycles only (timing-only simulation)
    python examples/resnet.py --depth 50 --size 224 --timing  # ResNet-50's
    python examples/resnet.py --size 64                       # values too, checked against torch
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


class Bottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, stride: int) -> None:
        super().__init__()
        cout = 4 * mid
        self.conv1 = nn.Conv2d(cin, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = nn.Conv2d(mid, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))
        return F.relu(self.bn3(self.conv3(y)) + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """depth 18: two 3x3 convolutions a block, 2-2-2-2 blocks; 50: bottlenecks, 3-4-6-3."""

    def __init__(self, depth: int = 18, classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        blocks, cin = [], 64
        for stage, (width, count) in enumerate(zip((64, 128, 256, 512), (2, 2, 2, 2) if depth == 18 else (3, 4, 6, 3))):
            for k in range(count):
                stride = 2 if stage > 0 and k == 0 else 1
                blocks.append(BasicBlock(cin, width, stride) if depth == 18 else Bottleneck(cin, width, stride))
                cin = width if depth == 18 else 4 * width
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = self.layers(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="mncore2:auto")
    parser.add_argument("--depth", type=int, choices=(18, 50), default=18)
    parser.add_argument("--size", type=int, default=64, help="image height and width")
    parser.add_argument("--timing", action="store_true", help="timing-only simulation (no values)")
    parser.add_argument("--top", type=int, default=10, help="ops to list, costliest first")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = ResNet(args.depth).eval()
    ctx = Context(MNDevice(args.device))
    set_tensor_name_in_module(model, f"resnet{args.depth}")
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
    print(f"ResNet-{args.depth} at {args.size}x{args.size} on {args.device}: {infer.last_cycles:,} cycles")
    call = ctx.session.calls[-1].runs[-1]  # the call itself (the runs before it upload the parameters)
    for name, cycles, _ in sorted(op_cycles(call.stats, call.labels), key=lambda r: -r[1])[:args.top]:
        print(f"{cycles:>12,}  {name}")


if __name__ == "__main__":
    main()
