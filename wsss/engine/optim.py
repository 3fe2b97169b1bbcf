"""The optimiser and the update of one step, without waiting for the device.

The reference's optimiser is AdamW over the model's parameter groups. Here it is PyTorch's fused AdamW (one
kernel for all parameters, CPU and CUDA), because the fused implementation honours a ``found_inf`` flag held
on the device, as ``torch.amp.GradScaler`` uses it: a step whose flag is set changes nothing (weights, moments
and step count stay as they were), and no Python code has to look at the flag first.

:class:`NonFiniteGuard` sets that flag from the step's loss and gradients, and after the update from the
optimiser state (AdamW's moments: a finite gradient whose square overflows), on the device, and keeps it set once
a non-finite value has been seen, so every later update of the run is skipped too. The loop reads the guard
with :meth:`NonFiniteGuard.raise_if_tripped` where it synchronises anyway (log interval, validation,
checkpoint): the run then stops with the weights of the last good step (after a non-finite optimiser state, of
the step that produced it), and the checkpoint written before stays the last good one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from wsss.config import OptimConfig
from wsss.models.segmentor import WSSSModel
from wsss.utils.distributed import all_reduce_mean


class NonFiniteLossError(FloatingPointError):
    """A loss, a gradient or the optimiser state became NaN or infinite; the updates from then on were skipped."""


def build_optimizer(model: WSSSModel, cfg: OptimConfig) -> torch.optim.AdamW:
    """Fused AdamW over :meth:`WSSSModel.param_groups` with ``cfg``'s rates, decay and betas."""
    groups = model.param_groups(cfg.lr, cfg.head_lr_mult, cfg.weight_decay, cfg.no_decay_1d)
    return torch.optim.AdamW(groups, betas=cfg.betas, fused=True)


class NonFiniteGuard:
    """Device-side check of every step: a NaN or inf in the loss or any gradient skips the update.

    Args:
        optimizer: A fused AdamW (:func:`build_optimizer`); the guard's flag becomes its ``found_inf``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer):
        device = next(p.device for g in optimizer.param_groups for p in g["params"])
        self.optimizer = optimizer
        self.found = torch.zeros((), device=device)
        """1.0 from the first non-finite step on, 0.0 before (the optimiser's ``found_inf``)."""
        self.first_step = torch.full((), -1, dtype=torch.long, device=device)
        """Index of the first non-finite step, -1 while there is none."""
        self.state_step = torch.full((), -1, dtype=torch.long, device=device)
        """Index of the step whose update first made the optimiser state NaN/inf, -1 while there is none."""
        self.iteration = torch.full((), -1, dtype=torch.long, device=device)
        """The index of the step being checked, on the device (:meth:`start`), so that a captured graph reads it."""
        self._one = torch.ones((), device=device)
        optimizer.found_inf = self.found
        optimizer.register_step_post_hook(self._check_state)

    def start(self, it: int) -> None:
        """Name the step about to be checked (written on the device, outside any captured graph)."""
        self.iteration.fill_(it)

    def update(self, loss: Tensor, it: int | None = None) -> None:
        """Check ``loss`` and the gradients of step ``it`` (after ``backward``, before ``optimizer.step``).

        Every rank takes the same decision (the flags are averaged over ranks), so the replicas stay equal.

        Args:
            loss: The step's loss.
            it: The step's index; None when :meth:`start` was given it already (a captured graph).
        """
        if it is not None:
            self.start(it)
        grads = [p.grad for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        found = torch.zeros_like(self.found)
        # GradScaler's check: sets ``found`` where a gradient holds a NaN/inf (multiplying by 1 changes nothing)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, self._one)
        found = torch.maximum(found, (~torch.isfinite(loss.detach())).float())
        found = (all_reduce_mean(found) > 0).float()
        self.first_step.copy_(torch.where((found > 0) & (self.found == 0), self.iteration, self.first_step))
        self.found.copy_(torch.maximum(self.found, found))

    def _check_state(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        """After every update (an optimiser step post-hook): a finite gradient whose square overflows leaves AdamW's
        ``exp_avg_sq`` infinite while the weights stay finite, and a run resumed from it cannot train. Such a state
        trips the guard as a non-finite loss does, on the device: the later updates are skipped, and no checkpoint
        is written with it. The moments are equal on every rank (their gradients were averaged), so all decide
        alike."""
        moments = [
            v
            for state in optimizer.state.values()
            for key, v in state.items()
            if key != "step" and torch.is_tensor(v) and v.is_floating_point()
        ]
        if not moments:
            return
        found = torch.zeros_like(self.found)
        torch._amp_foreach_non_finite_check_and_unscale_(moments, found, self._one)
        self.state_step.copy_(torch.where((found > 0) & (self.found == 0), self.iteration, self.state_step))
        self.found.copy_(torch.maximum(self.found, found))

    def raise_if_tripped(self, last_good: object) -> None:
        """Raise :class:`NonFiniteLossError` if any step so far was non-finite (reads the device once).

        Args:
            last_good: What to name as the last good checkpoint in the message (None: none yet).
        """
        first, state = torch.stack([self.first_step, self.state_step]).tolist()
        where = (
            f"non-finite loss or gradient at iteration {first}; that update and all later ones were skipped"
            if first >= 0
            else f"non-finite optimiser state (AdamW moments) after the update of iteration {state}; all later "
            "updates were skipped"
        )
        if first >= 0 or state >= 0:
            raise NonFiniteLossError(
                f"{where}. Last good checkpoint: {last_good or 'none yet'}. Lower optim.lr or check the data."
            )
