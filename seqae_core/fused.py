"""Models of one shape trained as one batched model: a pack.

Models whose configs differ in no tensor's shape (a run's ``train.repeats`` seeds, or a sweep's
trials that differ only in :data:`~seqae_core.config.FREE_KEYS`) stack their weights into tensors of shape (k, ...),
and one forward pass computes all k models at once (``torch.func``: the members' modules become one
functional model, ``vmap`` maps it over the leading axis), where training them one after another
launches k times as many small kernels. This follows HFTA (Wang et al., MLSys 2021) and PyTorch's
model-ensembling recipe (``stack_module_state``, ``functional_call``, ``vmap``).

Each member still trains as it would alone:

- the loss is the sum of the members' mean losses, so each member's gradient is its own (no
  member's loss reaches another's weights, a non-finite one neither);
- one AdamW steps the stacked weights (:class:`seqae_core.adamw.StackedAdamW`): AdamW is elementwise,
  and each member has its own learning rate, schedule and weight decay there, so each member's
  update is the one its own optimizer would make (seqae clips no gradients; a clip by norm would
  have to be per member);
- each member sees its own batches (the order drawn from its seed), stacked (k, b, t);
- the vocabulary head runs per member, the kernels of an unfused run on each member's slice.

At a validation the pack is unstacked into each member's own model, optimizer and schedule
(:meth:`Pack.unstack`), so evaluation, metrics and the checkpoint are exactly as without fusion, and
a run resumes fused or not from either's checkpoint (:meth:`Pack.stack` reads them back).

fp32 without dropout, a member's metrics equal its run's alone within float rounding (the
batched matmuls sum in another order). With dropout, ``vmap(randomness="different")`` draws each
member its own masks, from one stream: the same distribution as alone, other draws.

Shape letters: k members   b batch   t tokens   d d_model   v vocab
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from seqae_core.adamw import StackedAdamW
from seqae_core.config import Config
from seqae_core.loss import IGNORE, HeadPlan, head_cross_entropy, targets_of
from seqae_core.model import ReducingAutoencoder
from seqae_core.schedule import Schedule
from seqae_core.step import Window

# The device types on which ``train.fuse_repeats=auto`` packs a run's seeds: those where ``seqae
# bench fuse`` measured the pack faster than the seeds one after another (docs/explanation/
# performance.md). A CPU measured slower; CUDA joins when the GPU check measures it faster there,
# not before: a default is a measured choice, and the fused step has not yet run on a GPU.
MEASURED_FASTER: frozenset[str] = frozenset()


def fuses(config: Config, device: torch.device) -> bool:
    """Whether ``train.fuse_repeats`` packs the run's seeds on ``device``: ``on``, or ``auto`` on a
    device type in :data:`MEASURED_FASTER`; never a run of one seed unless asked, nor one that
    compiles its step."""
    choice = config.train.fuse_repeats
    if config.train.repeats == 1 or config.train.compile == "on":
        return choice == "on" and config.train.compile != "on"
    return choice == "on" or (choice == "auto" and device.type in MEASURED_FASTER)


class _Hidden(nn.Module):
    """A model's encoder and decoder as one module, for ``functional_call``: tokens (b, t) ->
    hidden (b, t, d), before the vocabulary head (which runs per member, outside ``vmap``)."""

    def __init__(self, model: ReducingAutoencoder) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.decode(self.model.encode(tokens))


class Pack:
    """k models of one shape as stacked weights, with one optimizer over them that gives member i
    its own ``lr[i]``, ``weight_decay[i]`` and ``schedule[i]``, and a static-shape step that the
    device never waits on the host for (as :class:`seqae_core.step.TrainStep`).

    Built from the members' own models, optimizers and schedules (:meth:`stack`), and written back
    into them at a validation (:meth:`unstack`); in between, the pack's are the ones that train."""

    def __init__(
        self,
        models: list[ReducingAutoencoder],
        *,
        lr: list[float],
        weight_decay: list[float],
        schedule: list[Schedule],
        plan: HeadPlan,
        autocast: Callable[[], Any],
        pad_id: int,
        device: torch.device,
    ) -> None:
        wrapped = [_Hidden(model) for model in models]
        # named_parameters lists a tied weight once (the embedding, registered before the head), the
        # order each member's optimizer indexes its state by: the pack's optimizer keeps that order.
        self.params, self.buffers = stack_module_state(wrapped)  # type: ignore[arg-type]
        ids = {id(p): name for name, p in wrapped[0].named_parameters()}
        self.head_weight = ids[id(models[0].head.weight)]  # "model.embed.weight" when tied
        self.head_bias = ids[id(models[0].head.bias)]
        self.base = copy.deepcopy(wrapped[0]).to("meta")  # the structure only: functional_call brings the weights
        self.k = len(models)
        self.optimizer = StackedAdamW(
            list(self.params.values()), lr=lr, weight_decay=weight_decay, schedule=schedule, device=device
        )
        self.plan, self.autocast, self.pad_id = plan, autocast, pad_id
        self._hidden = vmap(self._one_hidden, randomness="different")  # each member its own dropout masks
        self._loss_sum = torch.zeros(self.k, dtype=torch.float32, device=device)
        self._tokens = torch.zeros(self.k, dtype=torch.int64, device=device)
        self._step = torch.zeros((), dtype=torch.int64, device=device)
        self._bad_step = torch.zeros(self.k, dtype=torch.int64, device=device)

    def _one_hidden(
        self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], tokens: torch.Tensor
    ) -> torch.Tensor:
        return functional_call(self.base, (params, buffers), (tokens,))  # type: ignore[no-any-return]

    def train(self, mode: bool = True) -> None:
        """Dropout on (training) or off, as ``nn.Module.train``: ``vmap`` runs the base's modules."""
        self.base.train(mode)

    # --- the step ---

    def loss_of(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (k, b, t), member i's batch at i -> (each member's summed loss (k,), its scored tokens (k,))."""
        k, b, t = tokens.shape
        targets = targets_of(tokens, self.pad_id).reshape(k, b * t)  # (k, b t)
        with warnings.catch_warnings():
            # PyTorch has no batching rule for the CPU's fused attention kernel: vmap runs it once per
            # member, as the unfused run does, and warns of it every run.
            warnings.filterwarnings("ignore", message=".*batching rule for aten::_scaled_dot_product")
            hidden = self._hidden(self.params, self.buffers, tokens)  # (k, b, t, d)
        weights, biases = self.params[self.head_weight], self.params[self.head_bias]  # (k, v, d), (k, v)
        # The head per member: the unfused run's kernels on each member's slice (unbind's gradient
        # is one stack back into the (k, ...) weights).
        sums = [
            head_cross_entropy(h.reshape(b * t, -1), w, bias, target, self.plan, predict=False)[0]
            for h, w, bias, target in zip(hidden.unbind(0), weights.unbind(0), biases.unbind(0), targets.unbind(0))
        ]
        return torch.stack(sums), (targets != IGNORE).sum(dim=1)

    def __call__(self, tokens: torch.Tensor) -> None:
        """One optimizer step of every member, on tokens (k, b, t)."""
        with self.autocast():
            loss_sums, counts = self.loss_of(tokens)  # (k,), (k,)
        self.optimizer.zero_grad()
        # The sum of the members' means: d(sum)/d(member i's loss) = 1, so each gradient is its member's own.
        (loss_sums / counts.clamp(min=1)).sum().backward()
        self.optimizer.step()
        self._step += 1
        # Each member's first non-finite step stays recorded (its later steps see NaN weights too).
        self._bad_step = torch.where(torch.isfinite(loss_sums) | (self._bad_step > 0), self._bad_step, self._step)
        self._loss_sum += loss_sums.detach()
        self._tokens += counts

    def read(self) -> list[Window]:
        """Each member's window, and zeroed sums for the next: the host's one wait per window."""
        rows = torch.stack([self._loss_sum.double(), self._tokens.double(), self._bad_step.double()]).tolist()
        self._loss_sum.zero_()
        self._tokens.zero_()
        return [
            Window(loss=loss / max(tokens, 1), tokens=int(tokens), bad_step=int(bad))
            for loss, tokens, bad in zip(*rows)
        ]

    def count_from(self, done: int) -> None:
        """As :meth:`seqae_core.step.TrainStep.count_from`."""
        self._step.fill_(done)
        self._bad_step.zero_()

    # --- to and from each member's own state ---

    @torch.no_grad()
    def stack(
        self,
        models: list[ReducingAutoencoder],
        optimizers: list[torch.optim.Optimizer],
        schedulers: list[torch.optim.lr_scheduler.LRScheduler],
    ) -> None:
        """Take the members' weights, optimizer states and schedules: a fresh run's or a resumed
        one's, whether its checkpoint was written fused or not."""
        for name, stacked in self.params.items():
            stacked.copy_(torch.stack([_Hidden(m).get_parameter(name) for m in models]))
        for name, stacked in self.buffers.items():
            stacked.copy_(torch.stack([_Hidden(m).get_buffer(name) for m in models]))
        self.optimizer.load(optimizers, schedulers)

    @torch.no_grad()
    def unstack(
        self,
        models: list[ReducingAutoencoder],
        optimizers: list[torch.optim.Optimizer],
        schedulers: list[torch.optim.lr_scheduler.LRScheduler],
    ) -> None:
        """Write member i's weights, optimizer state and schedule into its own, as if it had
        trained alone: what evaluation, the metrics and the checkpoint then read."""
        for name, stacked in self.params.items():
            for i, m in enumerate(models):
                _Hidden(m).get_parameter(name).copy_(stacked[i])
        for name, stacked in self.buffers.items():
            for i, m in enumerate(models):
                _Hidden(m).get_buffer(name).copy_(stacked[i])
        self.optimizer.store(optimizers, schedulers)
