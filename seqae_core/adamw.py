"""AdamW over a pack's stacked weights, each member with its own learning rate, schedule and weight
decay (``seqae_core.fused``).

``torch.optim.AdamW`` takes one learning rate per parameter group, and a member is a slice of every
stacked tensor, not a group. So each member steps with the kernel its own ``AdamW(fused=True)``
runs alone (``torch._fused_adamw_``, one call over all its tensors), on its slices of the stacked
weights, gradients and moments (views: member i's is row i of each (k, ...) tensor): k calls a step
where writing AdamW's update out would take six kernels a stacked weight, and each member's update
is the one it would make alone (on a CPU bit for bit; see :meth:`step`). Its learning rate is a
device tensor, computed on the device from a device step count, so a step queues its kernels and
returns, as :class:`seqae_core.step.TrainStep` does. HFTA (Wang et al., MLSys 2021) fuses its optimizers over
stacked weights too.

It reads and writes each member's own ``torch.optim.AdamW`` and ``LambdaLR`` state (:meth:`load`,
:meth:`store`), so a member's checkpoint is the one it would have written alone.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from seqae_core.schedule import Schedule


def _rows(stacked: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Member i's views of (k, ...) tensors: row i of each, one ``unbind`` a tensor."""
    return [list(rows) for rows in zip(*(t.unbind(0) for t in stacked))]


class StackedAdamW:
    """AdamW on stacked weights (k, ...): member i steps with ``lr[i] * schedule[i](step)`` and
    ``weight_decay[i]``; the members share betas, eps and the step count (a pack's stand at one place)."""

    def __init__(
        self,
        params: list[torch.Tensor],
        *,
        lr: list[float],
        weight_decay: list[float],
        schedule: list[Schedule],
        device: torch.device,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        assert len(lr) == len(weight_decay) == len(schedule) == params[0].shape[0], "one setting per member"
        self.params, self.betas, self.eps = params, betas, eps
        self.schedules = list(schedule)

        def column(values: list[float] | list[bool], dtype: torch.dtype = torch.float64) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        # float64: the factor and lr are the host's LambdaLR values bit for bit (same IEEE operations).
        self.lr, self.weight_decay, self.k = column(lr), [float(w) for w in weight_decay], len(lr)
        self._end, self._linear = column([s.end for s in schedule]), column([s.linear for s in schedule], torch.bool)
        self._decay_steps = column([float(s.decay_steps) for s in schedule])
        self.steps = torch.zeros((), dtype=torch.float64, device=device)  # optimizer steps taken
        self._steps32 = torch.zeros((), dtype=torch.float32, device=device)
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]
        # Each member's rows of the weights and moments, made once (every write to them is in place):
        # views made afresh each step would cost the host more than the k kernels take on a GPU.
        self._rows = [_rows([p.detach() for p in params]), _rows(self.exp_avg), _rows(self.exp_avg_sq)]

    def current_lr(self) -> torch.Tensor:
        """(k,) float64: each member's learning rate for the next step, as its ``LambdaLR`` sets it."""
        done = torch.where(
            self._decay_steps > 0, torch.clamp(self.steps / self._decay_steps.clamp(min=1.0), max=1.0), 1.0
        )
        return self.lr * torch.where(self._linear, 1.0 + (self._end - 1.0) * done, self._end)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        beta1, beta2 = self.betas
        # A CPU's kernel reads the lr tensor as a double, as it takes the host's float alone: the same
        # update bit for bit. CUDA's reads a float32 one (and a float alone as a double): float noise.
        lr = self.current_lr()
        lr = lr.to(torch.float32) if lr.is_cuda else lr
        self.steps += 1
        self._steps32.copy_(self.steps)  # the kernel's count, a float32 tensor as AdamW's state "step"
        live = [j for j, p in enumerate(self.params) if p.grad is not None]
        grads = _rows([self.params[j].grad for j in live])  # type: ignore[misc]  # live: not None
        weights, exp_avgs, exp_avg_sqs = ([[member[j] for j in live] for member in rows] for rows in self._rows)
        for i, (w, g, m, v) in enumerate(zip(weights, grads, exp_avgs, exp_avg_sqs)):
            torch._fused_adamw_(  # type: ignore[attr-defined]
                w,
                g,
                m,
                v,
                [],
                [self._steps32] * len(live),
                lr=lr[i],
                beta1=beta1,
                beta2=beta2,
                weight_decay=self.weight_decay[i],
                eps=self.eps,
                amsgrad=False,
                maximize=False,
            )

    # --- to and from each member's own torch.optim.AdamW and LambdaLR ---

    @torch.no_grad()
    def load(
        self, optimizers: list[torch.optim.Optimizer], schedulers: list[torch.optim.lr_scheduler.LRScheduler]
    ) -> None:
        """Take the members' moments and step count: a fresh run's (none yet) or a resumed one's.
        Their optimizers index the state as :attr:`params` list the stacked weights."""
        states = [o.state_dict()["state"] for o in optimizers]
        counts = {s.last_epoch for s in schedulers}
        assert len(counts) == 1, f"a pack's members stand at one step, not {sorted(counts)}"
        self.steps.fill_(counts.pop())
        for index, (exp_avg, exp_avg_sq) in enumerate(zip(self.exp_avg, self.exp_avg_sq)):
            if index in states[0]:
                exp_avg.copy_(torch.stack([s[index]["exp_avg"] for s in states]))
                exp_avg_sq.copy_(torch.stack([s[index]["exp_avg_sq"] for s in states]))
            else:
                exp_avg.zero_()
                exp_avg_sq.zero_()

    @torch.no_grad()
    def store(
        self, optimizers: list[torch.optim.Optimizer], schedulers: list[torch.optim.lr_scheduler.LRScheduler]
    ) -> None:
        """Write member i's moments, step count and learning rate into its own optimizer and
        schedule, as if it had taken the steps alone (the host reads the step count: once a part)."""
        steps = int(self.steps.item())
        for i, (optimizer, scheduler) in enumerate(zip(optimizers, schedulers)):
            lr = scheduler.base_lrs[0] * self.schedules[i](steps)  # LambdaLR.get_lr's product
            groups = copy.deepcopy(optimizer.state_dict()["param_groups"])
            for group in groups:
                group["lr"] = lr
            state: dict[int, dict[str, Any]] = (
                {}
                if steps == 0
                else {
                    index: {
                        "step": torch.tensor(float(steps), dtype=torch.float32),
                        "exp_avg": exp_avg[i].clone(),
                        "exp_avg_sq": exp_avg_sq[i].clone(),
                    }
                    for index, (exp_avg, exp_avg_sq) in enumerate(zip(self.exp_avg, self.exp_avg_sq))
                }
            )
            optimizer.load_state_dict({"state": state, "param_groups": groups})
            saved = scheduler.state_dict()
            scheduler.load_state_dict(
                {
                    **saved,
                    "last_epoch": steps,
                    "_last_lr": [lr],
                    "_step_count": saved["_step_count"] + steps - saved["last_epoch"],
                }
            )
