"""Functions that take gradients (torch.autograd.grad) compile: the backward ops are traced through
autograd, decomposed like any other op, and run on the chip; values match torch's autograd.

Parameters here are plain inputs and the function returns its gradients; training steps with
device-resident parameters and optimizers are tested in tests/mlsdk/test_training.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import hwdesc
from compiler import compile_function
from runtime import Device
from compiler.errors import UnsupportedOpError

CHIPS = ("mini", "mncore2")


@pytest.fixture(scope="module", params=CHIPS)
def device(request) -> Device:
    return Device(hwdesc.load(request.param))


def gradient_function(model: nn.Module, loss_fn):
    """fn(d) -> loss and the gradient of every parameter, with the parameters as inputs."""
    names = [name for name, _ in model.named_parameters()]

    def fn(d):
        out = torch.func.functional_call(model, {k: d[k] for k in names}, (d["x"],))
        loss = loss_fn(out, d)
        grads = torch.autograd.grad(loss, [d[k] for k in names])
        return {"loss": loss, **{f"grad.{k}": g for k, g in zip(names, grads)}}
    params = {k: p.detach().clone().requires_grad_() for k, p in model.named_parameters()}
    return fn, params


def cross_entropy(out, d):
    return F.cross_entropy(out, d["labels"])


def square_mean(out, d):
    return out.pow(2).mean()


def mse_to_zero(out, d):
    return F.mse_loss(out, torch.zeros_like(out))


def margin_losses(out, d):
    """Multi-label targets ended by -1 (with a class after it, which does not count), and the
    multi-class margin loss with p=2 and weights, batched and on one row."""
    y = d["labels"]
    listed = torch.stack([y, (y + 3) % 10, torch.full_like(y, -1), (y + 5) % 10], -1)
    multilabel = torch.cat([listed, torch.full((y.shape[0], 6), -1, dtype=y.dtype)], -1)
    return (F.multilabel_margin_loss(out, multilabel) + F.multilabel_margin_loss(out[1], multilabel[1])
            + F.multi_margin_loss(out, y, p=2, margin=0.5, weight=torch.linspace(0.5, 1.5, 10))
            + F.multi_margin_loss(out[0], y[0], reduction="sum"))


def diagonals(out, d):
    """DETR's GIoU loss reads torch.diag of a pairwise matrix: the gradient is a diagonal_scatter."""
    pairs = out @ out.t()
    return torch.diag(pairs).mean() + torch.diag(out[:, :8], 1).pow(2).sum() + out.diagonal(-2).sum()


def gaussian_nll(out, d):
    target = d["labels"].float().unsqueeze(-1) / 10
    return (F.gaussian_nll_loss(out[:, :5], target.expand(-1, 5), F.softplus(out[:, 5:]) + 1e-3, full=True)
            + F.gaussian_nll_loss(out, target.expand(-1, 10), F.softplus(out[:, 0]) + 1e-3, reduction="sum")
            + F.gaussian_nll_loss(out, target.expand(-1, 10), 0.5))


MODELS = {
    "mlp_cross_entropy": (lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10)), cross_entropy,
                          (8, 16)),
    "layer_norm_gelu": (lambda: nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16), nn.GELU()), square_mean,
                        (4, 6, 16)),
    "softmax_mse": (lambda: nn.Sequential(nn.Linear(12, 12), nn.Softmax(-1)), mse_to_zero, (5, 12)),
    "conv_batch_norm_pool": (lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8, track_running_stats=False),
                                                   nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 10)),
                             cross_entropy, (2, 3, 8, 8)),
    "conv_strided_grouped": (lambda: nn.Sequential(nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.ReLU(),
                                                   nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4)),
                             square_mean, (2, 4, 9, 9)),
    # padding="valid": torch gives the convolution one padding for both dimensions, a list of one
    # (a bare IndexError at compile)
    "conv_padding_valid": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding="valid"), nn.Tanh(),
                                                 nn.Conv2d(4, 2, (2, 3), padding="valid", stride=(1, 2))),
                           square_mean, (2, 3, 7, 8)),
    "pool_overlapping_conv1d": (lambda: nn.Sequential(nn.Conv1d(3, 4, 5, stride=2), nn.Tanh(),
                                                      nn.MaxPool1d(3, stride=2, padding=1)),
                                square_mean, (2, 3, 21)),
    "avg_pools_upsample": (lambda: nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.AvgPool2d(3, 2, 1),
                                                 nn.Upsample(scale_factor=2),
                                                 nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
                                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 10)),
                           cross_entropy, (2, 2, 8, 8)),
    # windows that tile the input (stride = kernel) are a view of it and their gradients one view
    # back: cropped rows (floor mode), pooling padding, partial windows (ceil mode), clipped divisors
    "tiled_pools": (lambda: nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.MaxPool2d(2, padding=1), nn.Tanh(),
                                          nn.MaxPool2d(2, ceil_mode=True),
                                          nn.AvgPool2d(2, ceil_mode=True, count_include_pad=False),
                                          nn.AvgPool2d(3, padding=1), nn.Flatten(), nn.Linear(4, 10)),
                    cross_entropy, (2, 2, 12, 13)),
    # 3-D pooling as two 2-D ones (max with dilation, average with clipped divisors in ceil
    # mode), local response normalisation over a 5-D input (torch pools it with avg_pool3d)
    "pools_3d_lrn": (lambda: nn.Sequential(nn.Linear(8, 8), nn.MaxPool3d((2, 3, 2), stride=(1, 2, 2), padding=(0, 1, 1),
                                                                         dilation=(2, 1, 1)),
                                           nn.AvgPool3d(2, ceil_mode=True, count_include_pad=False, padding=1),
                                           nn.LocalResponseNorm(3, alpha=0.1), nn.Flatten(), nn.Linear(81, 10)),
                     cross_entropy, (2, 3, 6, 7, 8)),
    # 3-D convolutions as 2-D ones over the depths (strided, grouped, dilated, padded 'same')
    "conv3d": (lambda: nn.Sequential(nn.Conv3d(2, 4, 3, padding=1, stride=(1, 2, 2)), nn.Tanh(),
                                     nn.Conv3d(4, 4, (2, 3, 3), groups=2, dilation=(2, 1, 1), padding="same"),
                                     nn.Flatten(), nn.Linear(180, 10)),
               cross_entropy, (2, 2, 5, 6, 6)),
    # a 3-D encoder-decoder: transposed 3-D convolutions as 2-D ones laid at their depths
    "conv_transpose3d": (lambda: nn.Sequential(nn.Conv3d(2, 4, 3, stride=2, padding=1), nn.Tanh(),
                                               nn.ConvTranspose3d(4, 2, 3, stride=2, padding=1, output_padding=1),
                                               nn.Tanh(), nn.ConvTranspose3d(2, 2, (2, 1, 3), stride=(1, 2, 1), groups=2),
                                               nn.Flatten(), nn.Linear(2 * 5 * 11 * 6, 10)),
                         cross_entropy, (2, 2, 4, 6, 4)),
    # trilinear resampling and adaptive 3-D average-pooling as separable 2-D passes
    "trilinear_adaptive_3d": (lambda: nn.Sequential(nn.Conv3d(2, 3, 3, padding=1), nn.Upsample(scale_factor=(2, 1.5, 2),
                                                                                               mode="trilinear"),
                                                    nn.AdaptiveAvgPool3d((2, 3, None)), nn.Flatten(), nn.Linear(180, 10)),
                              cross_entropy, (2, 2, 3, 4, 5)),
    # a spatial transformer: the grid from the image, sampled bilinearly and nearest, three paddings
    "grid_sample": (lambda: SpatialTransformer(), cross_entropy, (2, 3, 6, 7)),
    # separable resampling: products with constant matrices, forward and backward
    "bilinear_adaptive_uneven": (lambda: nn.Sequential(nn.Conv2d(2, 3, 3, padding=1),
                                                       nn.Upsample(scale_factor=1.5, mode="bilinear"),
                                                       nn.Upsample(size=(11, 7), mode="bilinear", align_corners=True),
                                                       nn.AdaptiveAvgPool2d((3, 5)), nn.Flatten(), nn.Linear(45, 10)),
                                 cross_entropy, (2, 2, 6, 6)),
    "bicubic_antialiased": (lambda: nn.Sequential(nn.Conv2d(2, 3, 3, padding=1),
                                                  nn.Upsample(scale_factor=2, mode="bicubic"),
                                                  Resized((5, 6), "bilinear", antialias=True),
                                                  Resized((7, 5), "bicubic", antialias=True)),
                            square_mean, (2, 2, 6, 6)),
    "bilinear": (lambda: Bilinear(), cross_entropy, (6, 5)),
    # torch's decomposition of multilabel_margin_loss counted the targets after a -1 (wrong
    # values); neither margin loss's backward has one; gaussian_nll_loss checks var < 0 on the
    # host; RReLU in eval mode is a leaky ReLU
    "margin_losses_rrelu": (lambda: nn.Sequential(nn.Linear(16, 10), nn.RReLU(0.1, 0.3)).eval(), margin_losses,
                            (8, 16)),
    "gaussian_nll": (lambda: nn.Linear(16, 10), gaussian_nll, (8, 16)),
    "diagonals": (lambda: nn.Linear(16, 10), diagonals, (8, 16)),
    "masked_writes": (lambda: MaskedWrites(), square_mean, (8, 6)),
    "distances_shrinks": (lambda: Distances(), square_mean, (6, 4)),
    # reflection padding inside the network: torch's decomposition indexes both padded dims at once,
    # and its gradient was one gather of 4096 x 5184 runs, refused; as slices, flips and cats
    "reflection_pad_inside": (lambda: nn.Sequential(nn.Conv2d(8, 8, 1), nn.ReflectionPad2d((1, 2, 1, 1)),
                                                    nn.Conv2d(8, 4, 3, padding=1, padding_mode="reflect")),
                              square_mean, (2, 8, 16, 16)),
    "embedding_slices": (lambda: EmbedSlices(), square_mean, (3, 4)),
    "embedding_bags": (lambda: Bags(), square_mean, (3, 5)),
    # F.unfold forward is a window; its gradient (col2im) torch's decomposition
    "unfold": (lambda: nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.Unfold((2, 3), padding=1, stride=2)),
               square_mean, (2, 2, 7, 7)),
    "lstm_gru": (lambda: Recurrent(), square_mean, (2, 5, 3)),
    # the weight gradient of a depthwise convolution: the forward's patches times the output
    # gradient (as one convolution per channel, with the gradient as a kernel the size of the
    # image, MobileNetV2's 48 channels of 17 x 17 at stride 2 did not fit the PE memories of mini);
    # a channel multiplier and dilation; and a forward whose batch has fewer output pixels than
    # channels, a window of patches rather than a dense convolution with a block-diagonal weight
    "depthwise": (lambda: nn.Conv2d(4, 4, 3, padding=1, groups=4), square_mean, (2, 4, 6, 6)),
    "depthwise_strided": (lambda: nn.Conv2d(48, 48, 3, stride=2, groups=48), square_mean, (2, 48, 17, 17)),
    "depthwise_few_pixels": (lambda: nn.Sequential(nn.Conv2d(24, 48, 3, padding=2, dilation=2, groups=24),
                                                   nn.Tanh(), nn.Conv2d(48, 48, 3, padding=1, groups=48)),
                             square_mean, (2, 24, 2, 3)),
    # ceil-mode pooling windows far larger than the image (EfficientNet's pooler): the gradient of
    # the offsets that can reach the input only
    "pooling_past_the_image": (lambda: PastTheImage(), square_mean, (2, 3, 7, 8)),
    "transposed": (lambda: nn.Sequential(nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1),
                                         nn.Tanh(), nn.ConvTranspose2d(4, 2, (2, 3), stride=(1, 2), groups=2, dilation=2),
                                         nn.Flatten(2), nn.ConvTranspose1d(2, 2, 3, stride=3)),
                   square_mean, (2, 3, 4, 5)),
    # padding whose backward torch does not decompose (replication) or decomposes through an
    # uninitialised tensor (circular: new_empty_strided): autograd differentiates torch's forward
    # decomposition instead (frontend.above_autograd), and weight normalisation the same way
    "paddings": (lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReplicationPad2d((1, 2, 0, 1)), nn.Conv2d(3, 3, 2),
                                       nn.CircularPad2d(1), nn.Flatten(2), nn.ReplicationPad1d((2, 1)),
                                       nn.ReflectionPad1d(1)),
                 square_mean, (2, 2, 6, 7)),
    "nearest_exact": (lambda: nn.Sequential(nn.Conv2d(2, 2, 3), nn.Upsample(scale_factor=1.7, mode="nearest-exact"),
                                            nn.Upsample(size=(4, 5), mode="nearest-exact")),
                      square_mean, (2, 2, 6, 7)),
    # dims 0, 1 and -2 (torch's own norm_except_dim: a decomposition of the fused kernel's
    # interface normalised over the whole matrix for -2)
    "weight_norm": (lambda: nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Linear(6, 5)), nn.Tanh(),
                                          nn.utils.parametrizations.weight_norm(nn.Linear(5, 3), dim=1),
                                          nn.utils.parametrizations.weight_norm(nn.Linear(3, 4), dim=-2)),
                    square_mean, (4, 6)),
}


class PastTheImage(nn.Module):
    """Ceil-mode max and average pooling by kernels far larger than the feature map (one window)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x)
        return F.max_pool2d(y, 30, ceil_mode=True) + F.avg_pool2d(y, 40, ceil_mode=True) * y[..., :1, :1]


class Recurrent(nn.Module):
    """An LSTM (traced as its ATen composite, not oneDNN's fused layer) feeding a GRU."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.gru = nn.LSTM(3, 4, batch_first=True), nn.GRU(4, 2, batch_first=True)

    def forward(self, x):
        return self.gru(self.lstm(x)[0])[0][:, -1]


class Bags(nn.Module):
    """EmbeddingBags (mean with a padding index over fixed bags; weighted sums over offsets with
    an empty bag), their gradient summed into the rows each bag read."""

    def __init__(self) -> None:
        super().__init__()
        self.mean = nn.EmbeddingBag(7, 5, mode="mean", padding_idx=2)
        self.sums = nn.EmbeddingBag(7, 5, mode="sum")

    def forward(self, x):
        fixed = torch.tensor([[1, 2, 1], [0, 3, 3], [2, 2, 2]])  # the last bag is all padding
        flat, offsets = torch.tensor([4, 1, 4, 6, 0, 2]), torch.tensor([0, 2, 2])
        return self.mean(fixed) * x + self.sums(flat, offsets, per_sample_weights=x[:, :2].reshape(-1))


class EmbedSlices(nn.Module):
    """An embedding (its gradient an index_put that accumulates repeated tokens), index_select
    and strided slices (slice_scatter)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(7, 6)
        self.proj = nn.Linear(6, 6)

    def forward(self, x):
        tokens = torch.tensor([[1, 3, 1, 6], [0, 3, 3, 2], [5, 5, 5, 1]])
        h = self.proj(self.table(tokens)) * x.unsqueeze(-1)
        return torch.cat([h[:, 1::2, ::3], h.index_select(2, torch.tensor([5, 0]))], 1)


class MaskedWrites(nn.Module):
    """Writes through boolean masks inside a network: a floor, and attention to oneself masked."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 5)

    def forward(self, x):
        h = self.linear(x)
        h[h < 0] = 0.1
        scores = h @ h.t()
        scores[torch.eye(scores.shape[0], dtype=torch.bool)] = float("-inf")
        return scores.softmax(-1)


class Resized(nn.Module):
    """F.interpolate to a size, in a mode (nn.Upsample has no antialias)."""

    def __init__(self, size: tuple[int, int], mode: str, antialias: bool = False) -> None:
        super().__init__()
        self.size, self.mode, self.antialias = size, mode, antialias

    def forward(self, x):
        return F.interpolate(x, size=self.size, mode=self.mode, antialias=self.antialias)


class Bilinear(nn.Module):
    """nn.Bilinear (aten._trilinear in torch, which nothing decomposed) of x and its reverse."""

    def __init__(self) -> None:
        super().__init__()
        self.pair = nn.Bilinear(5, 5, 10)

    def forward(self, x):
        return self.pair(x, x.flip(-1))


@pytest.mark.parametrize("case", list(MODELS))
def test_gradients_match_torch_autograd(device, case):
    make, loss_fn, shape = MODELS[case]
    torch.manual_seed(7)
    fn, params = gradient_function(make(), loss_fn)
    inputs = {"x": torch.randn(shape), "labels": torch.randint(0, 10, (shape[0],)), **params}
    compiled = compile_function(fn, inputs, device.hw)
    got = device.execute(compiled, inputs)
    want = fn(inputs)
    assert set(got) == set(want)
    for name, expected in want.items():
        expected = expected.detach()
        torch.testing.assert_close(got[name], expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item(),
                                   msg=lambda m, name=name: f"{case} {name}: {m}")


class SpatialTransformer(nn.Module):
    """An affine grid computed from the image (the gradient reaches it through the sampling
    positions), sampled as torch's decomposition of grid_sampler_2d does."""

    def __init__(self):
        super().__init__()
        self.theta = nn.Linear(3, 6)
        self.head = nn.Linear(3 * 5 * 5 * 3, 10)

    def forward(self, x):
        theta = self.theta(x.mean((2, 3))).reshape(-1, 2, 3) * 0.1 + torch.tensor([[1.0, 0, 0], [0, 1.0, 0]])
        grid = F.affine_grid(theta, (x.shape[0], 3, 5, 5), align_corners=False)
        parts = [F.grid_sample(x, grid, "bilinear", "zeros", align_corners=False),
                 F.grid_sample(x, grid * 1.3, "bilinear", "border", align_corners=True),
                 F.grid_sample(x, grid * 1.3, "nearest", "reflection", align_corners=False)]
        return self.head(torch.cat(parts, 1).flatten(1))


class Distances(nn.Module):
    """cdist (zero distances on the diagonal of h to itself; p = 1; the product form past 25
    rows), softshrink, hardshrink and sgn, whose gradients torch does not decompose."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        h = self.linear(x)
        tall = torch.cat([h] * 5)  # 30 rows: torch's product form
        return (torch.cdist(h, x) + torch.cdist(h, h) + torch.cdist(h, h, p=1)
                + torch.cdist(tall, tall)[:6, :6] + F.softshrink(h, 0.2).sum() + F.hardshrink(h, 0.3).sum()
                + (torch.sgn(h) * h).sum())


class SparseEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(7, 4, sparse=True)

    def forward(self, x):
        return self.embedding(torch.tensor([1, 2, 3])) * x


def test_backward_ops_keep_the_users_line(mini):
    """A backward op mnsim cannot lower is refused naming it and the line that asked for the
    gradient (an embedding's sparse gradient: the device has no sparse tensors)."""
    fn, params = gradient_function(SparseEmbedding(), square_mean)
    with pytest.raises(UnsupportedOpError) as info:
        compile_function(fn, {"x": torch.randn(3, 4), **params}, mini)
    message = str(info.value)
    assert "aten._sparse_coo_tensor" in message and "sparse tensors are not simulated" in message
    assert "test_gradients.py" in message and "torch.autograd.grad(loss" in message


def test_scatter_matches_torch(device):
    """scatter (a number and a tensor) and scatter_add, the ops a cross-entropy gradient uses."""
    torch.manual_seed(9)
    x, src = torch.randn(6, 5), torch.randn(6, 3)
    index = torch.randint(0, 5, (6, 1))
    spread = torch.stack([torch.randperm(5)[:3] for _ in range(6)])

    def fn(d):
        return {"value": d["x"].scatter(1, d["i"], -1.0), "src": d["x"].scatter(1, d["s"], d["src"]),
                "add": d["x"].scatter_add(1, d["s"], d["src"])}
    inputs = {"x": x, "i": index, "s": spread, "src": src}
    got = device.execute(compile_function(fn, inputs, device.hw), inputs)
    for name, expected in fn(inputs).items():
        torch.testing.assert_close(got[name], expected, rtol=1e-6, atol=1e-6)


def test_writes_through_a_repeated_index_keep_the_last_write(device):
    """A write (not an accumulation) through a repeated index keeps one value, the last one, as
    torch on the host does: a multi-hot vector of ids with a repeat, index_put and `y[i] = v`
    with a repeated row, scatter of distinct values into one position. A sum of the writes (what
    a one-hot product gives) read 2 in the multi-hot vector; the adds still add."""
    ids = torch.tensor([[1, 3, 3, 3], [0, 0, 5, 0]])
    rows = torch.tensor([3, 1, 3])

    def fn(d):
        y = torch.zeros(6, 2)
        y[d["rows"]] = d["v"]
        return {"multi_hot": torch.zeros(2, 6).scatter(1, d["ids"], 1.0),
                "distinct": torch.zeros(2, 6).scatter(1, d["ids"], d["src"]),
                "add": torch.zeros(2, 6).scatter_add(1, d["ids"], d["src"]),
                "put": torch.zeros(6).index_put((d["rows"],), torch.tensor(2.0)), "setitem": y,
                "accumulated": torch.zeros(6).index_put((d["rows"],), d["v"][:, 0], accumulate=True),
                "fill": torch.ones(6, 2).index_fill(0, d["rows"], -1.0)}
    inputs = {"ids": ids, "rows": rows, "src": torch.arange(8.0).reshape(2, 4), "v": torch.arange(6.0).reshape(3, 2)}
    got = device.execute(compile_function(fn, inputs, device.hw), inputs)
    for name, expected in fn(inputs).items():
        torch.testing.assert_close(got[name], expected, rtol=0, atol=0, msg=name)
    assert got["multi_hot"][0, 3] == 1 and got["distinct"][1, 0] == 7 and got["setitem"][3, 1] == 5


@pytest.mark.parametrize("targets", ["padded", "concatenated"])
def test_ctc_loss_and_its_gradient_match_torch(targets):
    """F.ctc_loss runs as its definition (frontend.above_autograd._ctc), masked by lengths given
    as tensors: torch's kernel has shapes that depend on their values (DynamicOutputShapeException
    when traced). Inputs shorter than the frames, a target of length 0, and its gradient through
    a product and a log-softmax, on mini."""
    torch.manual_seed(11)
    mini = Device(hwdesc.load("mini"))
    frames, batch, classes = 10, 3, 6
    labels = torch.randint(1, classes, (batch, 4))
    lengths = torch.tensor([4, 2, 0])
    inputs = {"x": torch.randn(frames, batch, classes), "il": torch.tensor([10, 8, 5]), "tl": lengths,
              "tg": labels if targets == "padded" else torch.cat([labels[0], labels[1, :2]])}
    w = torch.randn(classes, classes, requires_grad=True)

    def fn(d):
        loss = F.ctc_loss((d["x"] @ w).log_softmax(2), d["tg"], d["il"], d["tl"])
        return {"loss": loss, "grad": torch.autograd.grad(loss, [w])[0]}
    got = mini.execute(compile_function(fn, inputs, mini.hw), inputs)
    for name, expected in fn(inputs).items():
        torch.testing.assert_close(got[name], expected.detach(), rtol=1e-5, atol=1e-5)


def test_the_ctc_definition_gives_torchs_reductions_and_impossible_alignments():
    """On the host, the definition against torch's kernel: every reduction, lengths as lists, an
    unbatched input, and an alignment that cannot happen (a target longer than the input): an
    infinite loss, or 0 with zero_infinity."""
    from compiler.frontend.above_autograd import _ctc
    torch.manual_seed(12)
    log_probs = torch.randn(8, 2, 5).log_softmax(2)
    labels = torch.randint(1, 5, (2, 3))
    for reduction in ("none", "mean", "sum"):
        torch.testing.assert_close(_ctc(log_probs, labels, [8, 6], [3, 1], reduction=reduction),
                                   F.ctc_loss(log_probs, labels, [8, 6], [3, 1], reduction=reduction))
    one = (log_probs[:, 0], labels[0], torch.tensor(8), torch.tensor(3))
    torch.testing.assert_close(_ctc(*one), F.ctc_loss(*one))
    short = (log_probs[:2], torch.ones(2, 3, dtype=torch.long), [2, 2], [3, 3])
    assert torch.isinf(_ctc(*short, reduction="none")).all()
    assert torch.equal(_ctc(*short, reduction="none", zero_infinity=True), torch.zeros(2))
    torch.testing.assert_close(_ctc(*short, reduction="none", zero_infinity=True),
                               F.ctc_loss(*short, reduction="none", zero_infinity=True))


@pytest.mark.parametrize("pool, options", [
    ("avg", {"kernel_size": 2}), ("avg", {"kernel_size": (3, 2, 3), "stride": (2, 1, 2), "padding": (1, 1, 0)}),
    ("avg", {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False}),
    ("avg", {"kernel_size": 2, "divisor_override": 3}),
    ("max", {"kernel_size": (3, 2, 3), "stride": (2, 1, 2), "padding": (1, 1, 0)}),
    ("max", {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}), ("max", {"kernel_size": 2, "dilation": 2})])
def test_3d_pooling_as_two_2d_poolings_gives_torchs_values(pool, options):
    """On the host, the separable forms against torch's 3-D kernels (batched and unbatched)."""
    from compiler.frontend.above_autograd import _avg_pool3d, _max_pool3d
    ours, theirs = (_avg_pool3d, F.avg_pool3d) if pool == "avg" else (_max_pool3d, F.max_pool3d)
    x = torch.randn(2, 3, 7, 9, 8, generator=torch.Generator().manual_seed(13))
    torch.testing.assert_close(ours(x, **options), theirs(x, **options))
    torch.testing.assert_close(ours(x[0], **options), theirs(x[0], **options))


@pytest.mark.parametrize("w_shape, options", [
    ((6, 4, 3, 3, 3), {"padding": 1}),
    ((6, 2, 2, 3, 1), {"stride": (2, 1, 2), "padding": (1, 0, 1), "dilation": (2, 1, 1), "groups": 2}),
    ((5, 4, 3, 2, 3), {"padding": "same"}), ((5, 4, 3, 3, 3), {"padding": "valid", "stride": 2})])
def test_3d_convolution_as_2d_ones_gives_torchs_values(w_shape, options):
    """On the host, the sum over kernel depths of 2-D convolutions against torch's conv3d."""
    from compiler.frontend.above_autograd import _conv3d
    g = torch.Generator().manual_seed(14)
    x, w, b = torch.randn(2, 4, 7, 9, 8, generator=g), torch.randn(*w_shape, generator=g), torch.randn(w_shape[0])
    torch.testing.assert_close(_conv3d(x, w, b, **options), F.conv3d(x, w, b, **options), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(_conv3d(x[0], w, None, **options), F.conv3d(x[0], w, None, **options),
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("options", [{"scale_factor": 2}, {"size": (7, 3, 9)}, {"scale_factor": 1.5, "align_corners": True},
                                     {"scale_factor": (1.7, 0.6, 2.2)}, {"size": 5, "align_corners": True}])
def test_trilinear_resampling_as_two_bilinear_passes_gives_torchs_values(options):
    """On the host, the separable trilinear form and the adaptive 3-D average-pooling against torch."""
    from compiler.frontend.above_autograd import _adaptive_avg_pool3d, _interpolate
    x = torch.randn(2, 3, 4, 5, 6, generator=torch.Generator().manual_seed(16))
    torch.testing.assert_close(_interpolate(x, mode="trilinear", **options), F.interpolate(x, mode="trilinear", **options))
    for size in (2, (3, None, 4), (1, 1, 1)):
        torch.testing.assert_close(_adaptive_avg_pool3d(x, size), F.adaptive_avg_pool3d(x, size))


@pytest.mark.parametrize("w_shape, options", [
    ((4, 3, 2, 2, 2), {"stride": 2}), ((4, 3, 3, 3, 3), {"stride": (2, 1, 2), "padding": 1, "output_padding": (1, 0, 1)}),
    ((4, 2, 3, 2, 3), {"groups": 2, "dilation": (2, 1, 1), "padding": (2, 0, 1)})])
def test_transposed_3d_convolution_as_2d_ones_gives_torchs_values(w_shape, options):
    """On the host, the 2-D transposed convolutions laid at their output depths against torch."""
    from compiler.frontend.above_autograd import _conv_transpose3d
    g = torch.Generator().manual_seed(17)
    x, w = torch.randn(2, 4, 3, 5, 4, generator=g), torch.randn(*w_shape, generator=g)
    b = torch.randn(w_shape[1] * options.get("groups", 1), generator=g)
    torch.testing.assert_close(_conv_transpose3d(x, w, b, **options), F.conv_transpose3d(x, w, b, **options),
                               rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(_conv_transpose3d(x[0], w, None, **options), F.conv_transpose3d(x[0], w, None, **options),
                               rtol=1e-5, atol=1e-4)


def _pivoting_matrices() -> torch.Tensor:
    """A batch of invertible 5 x 5 matrices, one with a zero where the first pivot would be and
    one with its rows permuted: elimination must exchange rows."""
    a = torch.randn(3, 5, 5, generator=torch.Generator().manual_seed(18)) + 3 * torch.eye(5)
    a[1, 0, 0] = 0.0
    a[2] = a[2][[3, 1, 4, 0, 2]]
    return a


def test_linear_algebra_by_elimination_gives_torchs_values():
    """On the host, Gauss-Jordan elimination with partial pivoting against torch's LAPACK calls:
    inverse, solve (matrix and vector right-hand sides, broadcast batches), determinant,
    slogdet and logdet (NaN for a negative determinant), and the gradient autograd takes
    through the eliminations."""
    from compiler.frontend.above_autograd import _det, _inv, _logdet, _slogdet, _solve
    a = _pivoting_matrices()
    b = torch.randn(3, 5, 2, generator=torch.Generator().manual_seed(19))
    torch.testing.assert_close(_inv(a), torch.linalg.inv(a), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(_solve(a, b), torch.linalg.solve(a, b), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(_solve(a, b[0, :, 0]), torch.linalg.solve(a, b[0, :, 0]), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(_det(a), torch.linalg.det(a), rtol=1e-5, atol=1e-4)
    for ours, theirs in zip(_slogdet(a), torch.linalg.slogdet(a)):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(_logdet(a), torch.logdet(a), rtol=1e-5, atol=1e-5, equal_nan=True)
    x, y = a.clone().requires_grad_(), a.clone().requires_grad_()
    (ours,) = torch.autograd.grad(_inv(x).sum() + _det(x).sum() + _slogdet(x)[1].sum(), [x])
    (theirs,) = torch.autograd.grad(torch.linalg.inv(y).sum() + torch.linalg.det(y).sum()
                                    + torch.linalg.slogdet(y)[1].sum(), [y])
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_linear_algebra_compiles_with_its_gradient(mini):
    """torch.linalg.inv, det, solve and logdet of a computed matrix, and their gradient, on the
    device (they were refused: aten.linalg_inv_ex and the other LAPACK calls have no
    decomposition)."""
    a = _pivoting_matrices()[1:]
    w = torch.eye(5) + 0.1 * torch.randn(5, 5, generator=torch.Generator().manual_seed(20))
    w.requires_grad_()
    inputs = {"a": a, "b": torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(21))}

    def fn(d):
        m = d["a"] @ w
        loss = (torch.linalg.inv(m).sum() + torch.linalg.det(m).sum() + torch.linalg.solve(m, d["b"]).sum()
                + torch.logdet(m @ m.transpose(-1, -2)).sum())
        return {"loss": loss, "grad": torch.autograd.grad(loss, [w])[0]}
    got = Device(mini).execute(compile_function(fn, inputs, mini), inputs)
    for name, expected in fn(inputs).items():
        torch.testing.assert_close(got[name], expected.detach(), rtol=1e-4, atol=1e-4 * expected.abs().max().item())
