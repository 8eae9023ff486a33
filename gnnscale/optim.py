"""Adam without torch's compiler: the trainers' default optimizer.

Every ``torch.optim.Optimizer`` loads ``torch._dynamo`` the first time it is built (``add_param_group`` and
``step`` are wrapped by ``torch._disable_dynamo``), and with it about 900 modules (sympy, triton's shared
library): about 150-180 MiB of resident memory in every training process, measured on torch 2.15, a third of a
1M-node partition's bytes.  A trainer that never compiles anything pays it for nothing, so the trainers'
default is this :class:`Adam`: torch's single-tensor Adam (``foreach=False``, the default on CPU), step for step
and bit for bit, in about forty lines (``tests/test_optim.py`` compares them).  Its ``state_dict`` has
torch's layout, so checkpoints move between the two.

A model given its own optimizer (``Trainer(optimizer=...)``) uses that one; torch's lr schedulers need a
``torch.optim.Optimizer`` and so such a factory.
"""

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

_HYPER = ("lr", "betas", "eps", "weight_decay")


class Adam:
    """Adam (Kingma & Ba) with L2 weight decay added to the gradient, as ``torch.optim.Adam``'s defaults.

    One parameter group (``param_groups[0]``, whose ``"lr"`` may be changed between steps); ``state[p]``
    holds ``step`` (a float32 scalar tensor, as torch's), ``exp_avg`` and ``exp_avg_sq``."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        params = list(params)
        if not params:
            raise ValueError("Adam was given no parameters; give it the model's parameters()")
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"Adam needs lr, eps, weight_decay >= 0 and betas in [0, 1); got lr={lr}, "
                             f"betas={betas}, eps={eps}, weight_decay={weight_decay}")
        self.param_groups: list[dict[str, Any]] = [
            {"params": params, "lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}]
        self.state: dict[nn.Parameter, dict[str, Tensor]] = {}
        self._post_hooks: OrderedDict[int, Callable[..., None]] = OrderedDict()  # a handle refers to it weakly

    @property
    def params(self) -> list[nn.Parameter]:
        return self.param_groups[0]["params"]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_().zero_()

    def register_step_post_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """``hook(optimizer, args, kwargs)`` after every :meth:`step`, as torch's optimizers call it; the
        handle's ``remove()`` unregisters it."""
        handle = RemovableHandle(self._post_hooks)
        self._post_hooks[handle.id] = hook
        return handle

    def step(self) -> None:
        """One update of every parameter that has a gradient (the others and their state untouched), then the
        step hooks."""
        self._update()
        for hook in list(self._post_hooks.values()):
            hook(self, (self,), {})  # torch passes step's own arguments, the optimizer first

    @torch.no_grad()
    def _update(self) -> None:
        group = self.param_groups[0]
        lr, (beta1, beta2), eps, decay = (group[k] for k in _HYPER)
        for p in self.params:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("Adam does not take sparse gradients; use torch.optim.SparseAdam for those")
            state = self.state.get(p)
            if state is None:
                state = self.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                         "exp_avg_sq": torch.zeros_like(p)}
            grad = p.grad if decay == 0 else p.grad.add(p, alpha=decay)
            state["step"] += 1
            step = state["step"].item()
            state["exp_avg"].lerp_(grad, 1 - beta1)
            state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (state["exp_avg_sq"].sqrt() / (1 - beta2 ** step) ** 0.5).add_(eps)
            p.addcdiv_(state["exp_avg"], denom, value=-(lr / (1 - beta1 ** step)))

    def state_dict(self) -> dict[str, Any]:
        """torch's layout: ``state`` keyed by the parameter's index, one group listing the indices."""
        index = {p: i for i, p in enumerate(self.params)}
        group = {k: self.param_groups[0][k] for k in _HYPER}
        return {"state": {index[p]: dict(s) for p, s in self.state.items()},
                "param_groups": [{**group, "amsgrad": False, "maximize": False,
                                  "params": list(range(len(self.params)))}]}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Load a state from :meth:`state_dict` or from a ``torch.optim.Adam`` over the same parameters."""
        groups = saved["param_groups"]
        indices = [i for g in groups for i in g["params"]]
        if len(indices) != len(self.params):
            raise ValueError(f"the saved optimizer state is for {len(indices)} parameters, this model has "
                             f"{len(self.params)}; resume with the model that wrote it")
        if any(g.get("amsgrad") or g.get("maximize") for g in groups) or len(groups) != 1:
            raise ValueError("the saved optimizer state is not plain Adam with one parameter group (amsgrad, "
                             "maximize or several groups); resume it with the optimizer that wrote it")
        self.param_groups[0].update({k: tuple(groups[0][k]) if k == "betas" else groups[0][k] for k in _HYPER})
        position = {i: n for n, i in enumerate(indices)}
        self.state = {}
        for i, s in saved["state"].items():
            p = self.params[position[int(i)]]
            if s["exp_avg"].shape != p.shape:
                raise ValueError(f"the saved optimizer state of parameter {i} has shape {tuple(s['exp_avg'].shape)}, "
                                 f"the model's is {tuple(p.shape)}; resume with the model that wrote it")
            self.state[p] = {"step": torch.as_tensor(s["step"], dtype=torch.float32).clone(),
                             "exp_avg": s["exp_avg"].to(p).clone(), "exp_avg_sq": s["exp_avg_sq"].to(p).clone()}
