"""The model suite: small models of the kinds people run through MLSDK, with random weights.

Sweeps name them as workloads (`program: transformer`), the tests compile every one against
torch, and the benchmarks time them. Each builder returns (function, inputs): the function takes
and returns dicts of tensors, as `Context.compile` wants, and captures its module's parameters
(constants of the program). Builders seed torch, so every process builds the same weights.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp():
    """An MLP classifier: logits' softmax and log-softmax, and the cross-entropy loss on int64 labels."""
    torch.manual_seed(10)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10))

    def fn(d):
        logits = model(d["x"])
        return {"probs": torch.softmax(logits, -1), "logp": F.log_softmax(logits, -1),
                "loss": F.cross_entropy(logits, d["labels"])}
    return fn, {"x": torch.randn(8, 20), "labels": torch.randint(0, 10, (8,))}


def cnn():
    """A CNN on an RGB image: conv with bias, BatchNorm (eval), ReLU, max pooling, a second
    conv, adaptive average pooling, flatten and a linear classifier."""
    torch.manual_seed(11)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(16, 10)).eval()
    with torch.no_grad():  # statistics that are not the identity, so that BatchNorm does something
        bn = model[1]
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.normal_()
        bn.bias.normal_()
    return (lambda d: {"y": model(d["x"])}), {"x": torch.randn(2, 3, 16, 16)}


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 conv + BatchNorm, ReLU, and the identity shortcut."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))) + x)


def resnet_block():
    torch.manual_seed(12)
    block = BasicBlock().eval()
    with torch.no_grad():
        for bn in (block.bn1, block.bn2):
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2.0)
    return (lambda d: {"y": block(d["x"])}), {"x": torch.randn(2, 16, 8, 8)}


class TransformerBlock(nn.Module):
    """A pre-LN transformer block: LayerNorm, 4-D multi-head scaled_dot_product_attention, GELU MLP,
    residuals."""

    def __init__(self, dim: int = 64, heads: int = 4, causal: bool = True) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.heads, self.causal = heads, causal

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(a)
        return x + self.mlp(self.ln2(x))


def transformer_block(causal: bool = True):
    torch.manual_seed(13)
    block = TransformerBlock(causal=causal)
    return (lambda d: {"y": block(d["x"])}), {"x": torch.randn(2, 16, 64)}


def batched_matmul_4d():
    torch.manual_seed(14)
    return (lambda d: {"y": d["a"] @ d["b"]}), {"a": torch.randn(2, 4, 64, 32), "b": torch.randn(2, 4, 32, 64)}


def one_input_two_matmuls():
    torch.manual_seed(15)
    return ((lambda d: {"y": d["x"] @ d["w1"], "z": d["x"] @ d["w2"]}),
            {"x": torch.randn(16, 32), "w1": torch.randn(32, 16), "w2": torch.randn(32, 8)})


def scalar_reductions():
    torch.manual_seed(16)

    def fn(d):
        x = d["x"]
        return {"sum": x.sum(), "mean": x.mean(), "max": x.amax(), "min": x.amin(), "argmax": x.argmax(),
                "mse": F.mse_loss(x, d["t"])}
    return fn, {"x": torch.randn(37, 53), "t": torch.randn(37, 53)}


MODELS = {
    "mlp": mlp, "cnn": cnn, "resnet_block": resnet_block,
    "transformer_causal": lambda: transformer_block(True), "transformer": lambda: transformer_block(False),
    "bmm_4d": batched_matmul_4d, "two_matmuls": one_input_two_matmuls, "reductions": scalar_reductions,
}
