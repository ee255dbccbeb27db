"""MLSDK's optimizers: `MNCoreSGD`, `MNCoreAdam`, `MNCoreAdamW`, and `MNCoreLRScheduler`.

They are `torch.optim.Optimizer`s whose state is device-resident: every state tensor exists
from construction (torch's optimizers make theirs at the first step, on the host), each group's
learning rate is a 0-d tensor (a scheduler changes it between calls without a recompile), and
`step()` is in-place tensor arithmetic on parameters and state, so a compiled training step
traces it into the program and the device updates the state in place. They also run eagerly
on the host, with the same arithmetic.

PFN does not publish MN-Core's update rules; these follow torch.optim's single-tensor
implementations (torch 2.x), operation for operation where the arithmetic allows, so a model
trained here matches one trained with torch.optim on the host to float32 rounding.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from typing import Any, Iterable, Iterator

import torch

from .errors import ArgumentError, OptionError

LR_KEY = "lr"


def _scalar(value: Any) -> torch.Tensor:
    """A hyper-parameter the program reads at every call: a 0-d float32 tensor."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.float32).reshape(())
    return torch.tensor(float(value), dtype=torch.float32)


def _scalar_value(value: Any) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


# Every MNCore optimizer's learning-rate tensors. Host code changes them in place (`group["lr"] = x`,
# torch's schedulers' fill_, load_state_dict); mlsdk.function sends a changed one to the device
# before a call of a compiled step, which reads the device copy (`changed_rates`, `sent`).
_RATES: "weakref.WeakSet[torch.Tensor]" = weakref.WeakSet()
_SENT = "_mnsim_sent_value"  # attribute of a rate: its value when last sent


class _ParamGroup(dict):
    """A parameter group whose learning rate stays its registered 0-d tensor: `group["lr"] = x`
    (torch's idiom for changing it) writes x into that tensor. Replaced by a number instead,
    compiled steps kept reading the old tensor, and steps compiled afterwards the number."""

    def __setitem__(self, key: str, value: Any) -> None:
        current = self.get(key)
        if key == LR_KEY and isinstance(current, torch.Tensor) and value is not current:
            with torch.no_grad():
                current.fill_(_scalar_value(value))
            return
        super().__setitem__(key, value)


def _rate(value: Any) -> torch.Tensor:
    rate = _scalar(value)
    _RATES.add(rate)
    sent(rate)
    return rate


def changed_rates() -> list[torch.Tensor]:
    """The learning rates changed on the host since they were last sent to a device."""
    return [rate for rate in list(_RATES) if getattr(rate, _SENT, None) != float(rate)]


def sent(rate: torch.Tensor) -> None:
    setattr(rate, _SENT, float(rate))


_RECORDING: "list[weakref.WeakSet[MNCoreOptimizer]]" = []  # per trace in progress (innermost last)


@contextlib.contextmanager
def recording_steps() -> Iterator["weakref.WeakSet[MNCoreOptimizer]"]:
    """The optimizers whose step() the function traced inside runs: each call of the compiled
    step is their step() for torch (`mark_stepped`)."""
    stepped: "weakref.WeakSet[MNCoreOptimizer]" = weakref.WeakSet()
    _RECORDING.append(stepped)
    try:
        yield stepped
    finally:
        _RECORDING.remove(stepped)


def mark_stepped(optimizers: Iterable[torch.optim.Optimizer]) -> None:
    """A call of a compiled step ran these optimizers' step() on the device: set torch's flag its
    LR schedulers read (`_opt_called`, set by the wrapper a scheduler puts on step()), so a
    scheduler stepped after the call does not warn that optimizer.step() never ran."""
    for optimizer in optimizers:
        optimizer._opt_called = True


class MNCoreOptimizer(torch.optim.Optimizer):
    """Base of the MN-Core optimizers: state made eagerly by `init_state`, the learning rate of
    each group a 0-d tensor (`group["lr"]`, registered with the state), and `update` called per
    parameter that has a gradient."""

    traceable_step = True  # compiler.frontend.tracing accepts this optimizer's step()

    def __init__(self, params: Iterable, defaults: dict[str, Any]) -> None:
        if _scalar_value(defaults[LR_KEY]) < 0:
            raise OptionError(f"{type(self).__name__}: invalid learning rate {_scalar_value(defaults[LR_KEY])}")
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1] = _ParamGroup(self.param_groups[-1])
        dict.__setitem__(group, LR_KEY, _rate(group[LR_KEY]))
        for p in group["params"]:
            if not p.is_floating_point():
                raise OptionError(f"{type(self).__name__}: parameter of dtype {p.dtype} cannot be trained")
            self.state[p].update(self.init_state(p, group))

    def init_state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The state tensors of parameter `p`, as they are before the first step."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load, with the values copied into this optimizer's own state tensors and
        learning rates, so the tensors a Context registered stay the ones the program updates
        (state a checkpoint lacks, saved before any step, keeps its initial value). The host
        tensors change: call `context.register_optimizer_buffers(optimizer)` again to send them
        to the device."""
        own = [(group[LR_KEY], {p: dict(self.state[p]) for p in group["params"]}) for group in self.param_groups]
        super().load_state_dict(state_dict)
        self.param_groups[:] = [_ParamGroup(group) for group in self.param_groups]  # torch made plain dicts
        with torch.no_grad():
            for group, (rate, states) in zip(self.param_groups, own):
                rate.fill_(_scalar_value(group[LR_KEY]))
                dict.__setitem__(group, LR_KEY, rate)
                for p, tensors in states.items():
                    loaded = self.state[p]
                    for key, t in tensors.items():
                        if key in loaded:
                            t.copy_(loaded[key])
                        loaded[key] = t

    def update(self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, torch.Tensor],
               group: dict[str, Any]) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        if _RECORDING:
            _RECORDING[-1].add(self)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    grad = p.grad if not group.get("maximize", False) else -p.grad
                    self.update(p, grad, self.state[p], group)
        return loss


class MNCoreSGD(MNCoreOptimizer):
    """Stochastic gradient descent, positional like torch.optim.SGD: `(params, lr, momentum,
    dampening, weight_decay, nesterov)`. torch's rule: g += weight_decay * p; with momentum,
    buf = g at the first step and momentum * buf + (1 - dampening) * g after it (nesterov:
    g + momentum * buf); p -= lr * buf. The momentum buffer starts at zero, which gives torch's
    first step when dampening is 0; otherwise a step counter in the state selects it."""

    def __init__(self, params: Iterable, lr: float | torch.Tensor = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False, *,
                 maximize: bool = False) -> None:
        if momentum < 0 or weight_decay < 0:
            raise OptionError(f"MNCoreSGD: invalid momentum {momentum} or weight_decay {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise OptionError("MNCoreSGD: nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize))

    def init_state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, torch.Tensor]:
        state = {}
        if group["momentum"] != 0:
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
            if group["dampening"] != 0:
                state["step"] = torch.tensor(0.0)
        return state

    def update(self, p, grad, state, group):
        if group["weight_decay"] != 0:
            grad = grad.add(p, alpha=group["weight_decay"])
        momentum = group["momentum"]
        if momentum != 0:
            buf = state["momentum_buffer"]
            if "step" in state:  # (1 - dampening) after the first step, 1 at it
                first = (state["step"] == 0).to(grad.dtype)
                buf.mul_(momentum).add_(grad * (1 - group["dampening"] + group["dampening"] * first))
                state["step"].add_(1)
            else:
                buf.mul_(momentum).add_(grad)
            grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
        p.sub_(group[LR_KEY] * grad)


class _AdamBase(MNCoreOptimizer):
    """torch's Adam: m = lerp(m, g, 1 - beta1); v = beta2 v + (1 - beta2) g^2; step t;
    p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps). `decoupled` is AdamW's
    p *= 1 - lr * weight_decay first; otherwise weight decay is L2 (g += weight_decay * p).
    With `torch_eps=False` (ONNX's Adam, MLSDK's `chainer_use_torch=False`) eps is added to
    sqrt(v) before the bias correction: p -= lr sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps)."""

    decoupled = False

    def __init__(self, params: Iterable, lr: Any, betas: tuple[float, float], eps: float, weight_decay: float,
                 torch_eps: bool = True, maximize: bool = False) -> None:
        beta1, beta2 = betas
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0) or eps < 0 or weight_decay < 0:
            raise OptionError(f"{type(self).__name__}: invalid betas {betas}, eps {eps} or weight_decay {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=(float(beta1), float(beta2)), eps=float(eps),
                                      weight_decay=float(weight_decay), torch_eps=torch_eps, maximize=maximize))

    def init_state(self, p, group):
        return {"step": torch.tensor(0.0),
                "exp_avg": torch.zeros_like(p, memory_format=torch.contiguous_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.contiguous_format)}

    def update(self, p, grad, state, group):
        beta1, beta2 = group["betas"]
        lr, wd, eps = group[LR_KEY], group["weight_decay"], group["eps"]
        step = state["step"]
        step.add_(1)
        if wd != 0:
            if self.decoupled:
                p.mul_(1 - lr * wd)
            else:
                grad = grad.add(p, alpha=wd)
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.add_((grad - exp_avg) * (1 - beta1))
        exp_avg_sq.mul_(beta2).add_(grad * grad * (1 - beta2))
        # 1 - beta^t as -expm1(t log beta): float32 rounding once, where 1 - pow(beta, t) in float32
        # loses digits for beta near 1 (torch computes it in double on the host)
        bias_correction1 = -torch.expm1(step * math.log(beta1)) if beta1 > 0 else torch.ones_like(step)
        bias_correction2_sqrt = torch.sqrt(-torch.expm1(step * math.log(beta2))) if beta2 > 0 else torch.ones_like(step)
        if group["torch_eps"]:
            denom = exp_avg_sq.sqrt() / bias_correction2_sqrt + eps
            p.sub_(lr / bias_correction1 * (exp_avg / denom))
        else:
            p.sub_(lr * bias_correction2_sqrt / bias_correction1 * (exp_avg / (exp_avg_sq.sqrt() + eps)))


def _pick(kwargs: dict[str, Any], names: tuple[str, ...], default: Any, owner: str) -> Any:
    given = [n for n in names if n in kwargs]
    if len(given) > 1:
        raise OptionError(f"{owner}: {' and '.join(given)} name the same hyper-parameter; pass one")
    return kwargs.pop(given[0]) if given else default


def _betas(kwargs: dict[str, Any], first: tuple[str, ...], second: tuple[str, ...], owner: str) -> tuple[float, float]:
    """`betas=(b1, b2)` or the two coefficients by their own names, not both."""
    beta1, beta2 = _pick(kwargs, first, None, owner), _pick(kwargs, second, None, owner)
    betas = kwargs.pop("betas", None)
    if betas is not None and (beta1 is not None or beta2 is not None):
        raise OptionError(f"{owner}: betas and {' / '.join(first + second)} name the same hyper-parameters; pass one")
    return tuple(betas) if betas is not None else (0.9 if beta1 is None else beta1, 0.999 if beta2 is None else beta2)


class MNCoreAdam(_AdamBase):
    """Adam, in either of MLSDK's spellings: `(params, lr=, betas=, eps=, weight_decay=,
    chainer_use_torch=True)` (torch's names and rule) or `(params, learning_rate=, alpha=, beta=,
    norm_coefficient=, epsilon=, chainer_use_torch=False)` (ONNX Adam's names: alpha and beta
    are the two averaging coefficients, norm_coefficient the L2 weight decay; eps added before
    the bias correction unless chainer_use_torch). Weight decay is L2, as torch.optim.Adam."""

    def __init__(self, params: Iterable, lr: Any = None, betas: tuple[float, float] | None = None,
                 eps: float | None = None, weight_decay: float | None = None, **kwargs: Any) -> None:
        owner = "MNCoreAdam"
        given = {k: v for k, v in dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay).items() if v is not None}
        kwargs = {**given, **kwargs}
        lr = _pick(kwargs, ("lr", "learning_rate"), 1e-3, owner)
        betas = _betas(kwargs, ("alpha", "beta1"), ("beta", "beta2"), owner)
        eps = _pick(kwargs, ("eps", "epsilon"), 1e-8, owner)
        weight_decay = _pick(kwargs, ("weight_decay", "norm_coefficient"), 0.0, owner)
        torch_eps = bool(kwargs.pop("chainer_use_torch", True))
        maximize = bool(kwargs.pop("maximize", False))
        if kwargs:
            raise ArgumentError(f"{owner}: unexpected keyword arguments {', '.join(sorted(kwargs))}")
        super().__init__(params, lr, betas, eps, weight_decay, torch_eps, maximize)


class MNCoreAdamW(_AdamBase):
    """AdamW (decoupled weight decay, torch.optim.AdamW's rule and defaults), in either spelling:
    `(params, lr=, betas=, eps=, weight_decay=)` or `(params, learning_rate=, beta1=, beta2=,
    eps=, weight_decay=)`. PFN notes theirs is not bit-compatible with LibTorch's; this one is
    torch's arithmetic."""

    decoupled = True

    def __init__(self, params: Iterable, lr: Any = None, betas: tuple[float, float] | None = None,
                 eps: float = 1e-8, weight_decay: float = 1e-2, **kwargs: Any) -> None:
        owner = "MNCoreAdamW"
        kwargs = {**({"lr": lr} if lr is not None else {}), **({"betas": betas} if betas is not None else {}),
                  **kwargs}
        lr = _pick(kwargs, ("lr", "learning_rate"), 1e-3, owner)
        betas = _betas(kwargs, ("beta1",), ("beta2",), owner)
        maximize = bool(kwargs.pop("maximize", False))
        if kwargs:
            raise ArgumentError(f"{owner}: unexpected keyword arguments {', '.join(sorted(kwargs))}")
        super().__init__(params, lr, betas, eps, weight_decay, True, maximize)


class MNCoreLRScheduler:
    """`MNCoreLRScheduler(torch_scheduler, context)`: `.step()` steps the torch scheduler on the
    host and writes each group's new learning rate into its device copy, so the next call of the
    compiled step uses it (no recompile: the rate is a resident 0-d tensor)."""

    def __init__(self, scheduler: Any, context: Any) -> None:
        optimizer = getattr(scheduler, "optimizer", None)
        if not isinstance(optimizer, MNCoreOptimizer):
            raise OptionError("MNCoreLRScheduler wraps a torch LR scheduler of an MNCore optimizer "
                             f"(got one of {type(optimizer).__name__})")
        if not callable(getattr(context, "is_registered", None)):
            raise ArgumentError(f"MNCoreLRScheduler(scheduler, context): context must be the mlsdk Context the "
                                f"optimizer's state is registered in, not {type(context).__name__}")
        self.scheduler, self.context = scheduler, context
        self._rates = [group[LR_KEY] for group in optimizer.param_groups]  # the registered tensors
        self._fixed = [{k: v for k, v in group.items() if k not in ("params", LR_KEY, "initial_lr")}
                       for group in optimizer.param_groups]  # compiled into the program as numbers

    def step(self, *args: Any, **kwargs: Any) -> None:
        self.scheduler.step(*args, **kwargs)
        for g, (group, rate) in enumerate(zip(self.scheduler.optimizer.param_groups, self._rates)):
            if group[LR_KEY] is not rate:  # a group torch rebuilt as a plain dict: the number into the tensor
                rate.fill_(_scalar_value(group[LR_KEY]))
                dict.__setitem__(group, LR_KEY, rate)
            changed = [k for k, v in self._fixed[g].items() if k in group and group[k] != v]
            if changed:
                raise OptionError(f"MNCoreLRScheduler: the scheduler changed {', '.join(changed)} of parameter group "
                                 f"{g}; the compiled step holds only the learning rate on the device (for "
                                 "OneCycleLR / CyclicLR pass cycle_momentum=False)")
            if not self.context.is_registered(rate):
                raise OptionError("MNCoreLRScheduler: the optimizer's learning rate is not registered, so compiled "
                                 "steps hold it as a number; call context.register_optimizer_buffers(optimizer) "
                                 "before compiling")
            self.context.get_registered_value_proxy(rate).load_from(rate)
            sent(rate)

    def get_last_lr(self) -> list[float]:
        return [_scalar_value(x) for x in self.scheduler.get_last_lr()]

    def state_dict(self) -> dict:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state)

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.scheduler, name)
