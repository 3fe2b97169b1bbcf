"""Learning-rate schedule: linear warm-up, then polynomial decay (ToCo's PolyWarmupAdamW rule).

For iteration ``it`` (0-based, the index of the optimiser step about to be taken):

- ``it < warmup_iters``: ``lr = base_lr * (1 - (1 - it / warmup_iters) * (1 - warmup_ratio))``, a line
  from ``base_lr * warmup_ratio`` at ``it = 0`` towards ``base_lr``;
- ``warmup_iters <= it < max_iters``: ``lr = base_lr * (1 - it / max_iters) ** power``;
- ``it >= max_iters``: 0.

The poly term counts from iteration 0, not from the end of the warm-up, as in the ToCo release and in
mmcv's ``PolyLrUpdaterHook``. ToCo applies the warm-up factor to ``base_lr``, so at ``it =
warmup_iters`` the rate steps from ``~base_lr`` down to ``base_lr * (1 - warmup_iters / max_iters) **
power`` (0.972 x for 2500 of 80000 iterations); this rule is kept. (mmcv multiplies the warm-up factor
into the poly value instead, which is continuous; mmengine's ``PolyLR(begin=warmup)`` restarts the
poly count at the warm-up end.)
"""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler


def lr_factor(it: int, max_iters: int, warmup_iters: int, warmup_ratio: float, power: float) -> float:
    """The multiplier of the base learning rate at iteration ``it`` (see the module docstring)."""
    if it < warmup_iters:
        return 1.0 - (1.0 - it / warmup_iters) * (1.0 - warmup_ratio)
    if it >= max_iters:
        return 0.0
    return (1.0 - it / max_iters) ** power


def lr_at(it: int, base_lr: float, max_iters: int, warmup_iters: int, warmup_ratio: float, power: float) -> float:
    """Learning rate at iteration ``it``: ``base_lr * lr_factor(...)``."""
    return base_lr * lr_factor(it, max_iters, warmup_iters, warmup_ratio, power)


class PolyWarmupScheduler(LRScheduler):
    """Scales every param group's initial lr by :func:`lr_factor` (so a 10x head group stays 10x).

    Call ``scheduler.step()`` after each ``optimizer.step()``; after construction the groups hold the
    rate of iteration 0, after ``t`` steps that of iteration ``t``. ``state_dict`` /
    ``load_state_dict`` resume exactly; loading also writes the restored iteration's rates into the
    optimiser's groups.

    Args:
        optimizer: The optimiser; each group's ``lr`` at construction is its base rate.
        max_iters: Total iterations.
        warmup_iters: Linear warm-up length.
        warmup_ratio: Warm-up start as a fraction of the base rate.
        power: Poly exponent.
        last_epoch: Index of the last completed iteration (-1 for a fresh start), as in torch.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        max_iters: int,
        warmup_iters: int,
        warmup_ratio: float,
        power: float,
        last_epoch: int = -1,
    ):
        self.max_iters = max_iters
        self.warmup_iters = warmup_iters
        self.warmup_ratio = warmup_ratio
        self.power = power
        super().__init__(optimizer, last_epoch)

    def _factor(self) -> float:
        return lr_factor(self.last_epoch, self.max_iters, self.warmup_iters, self.warmup_ratio, self.power)

    def get_lr(self) -> list[float]:
        return [base * self._factor() for base in self.base_lrs]

    def _get_closed_form_lr(self) -> list[float]:
        return self.get_lr()

    def resume_at(self, step: int) -> None:
        """Continue at iteration ``step`` on this scheduler's own schedule (the config's, not a checkpoint's):
        the groups get that iteration's rates from their base rates. A resumed run with an unchanged config
        gets exactly the rates of an uninterrupted one; a longer ``max_iters`` or another base rate applies.
        """
        self.last_epoch = step
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self.resume_at(self.last_epoch)
