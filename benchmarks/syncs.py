"""Counting what a training step makes the host wait for, and the operators it runs, on any device.

On a GPU a host sync is an operator whose result the host must read before it can go on: a
scalar read back (``.item()``, ``float(t)``, ``int(t)``: ``aten._local_scalar_dense``), an output
whose size depends on the data (``nonzero``, boolean-mask indexing, ``masked_select``). On a CPU
nothing waits, but the same operators run, so counting them in a ``TorchDispatchMode`` finds on a
CPU every sync the step would make on a GPU (``torch.cuda.set_sync_debug_mode`` is the GPU's own
check, in :mod:`benchmarks.step_check`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Reads of a tensor's values by the host, seen where Python calls them: on a CPU some of them
# (tolist, numpy) reach no operator a dispatch mode would see.
_READS = {"tolist", "item", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__"}
_ALWAYS = {
    "_local_scalar_dense",
    "nonzero",
    "masked_select",
    "unique",
    "_unique2",
    "unique_consecutive",
    "unique_dim",
    "repeat_interleave",
    "bincount",
    "masked_scatter",
    "argwhere",
}
_WITH_A_MASK = {"index", "index_put", "index_put_", "_index_put_impl_"}  # syncs when an index is boolean


def _has_bool_index(args: tuple[Any, ...]) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (indices or ()) if i is not None)


class _Reads(TorchFunctionMode):
    def __init__(self, syncs: Counter[str]) -> None:
        super().__init__()
        self.syncs = syncs
        self.depth = 0  # inside a read: the scalar it reads is that read's, not another sync

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name not in _READS:
            return func(*args, **(kwargs or {}))
        self.syncs[name] += self.depth == 0
        self.depth += 1
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.depth -= 1


class SyncCounter(TorchDispatchMode):
    """Counts, by name, the host syncs of the code run inside it (a read by the host, or an
    operator whose output's size depends on the data), and every operator it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: Counter[str] = Counter()
        self.ops: Counter[str] = Counter()
        self._reads = _Reads(self.syncs)

    def __enter__(self) -> SyncCounter:
        self._reads.__enter__()
        return super().__enter__()  # type: ignore[return-value]

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self._reads.__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        # A scalar read that Python asked for is counted once, where it asked (_Reads).
        if name == "_local_scalar_dense" and self._reads.depth:
            pass
        elif name in _ALWAYS or (name in _WITH_A_MASK and _has_bool_index(args)):
            self.syncs[name] += 1
        return func(*args, **(kwargs or {}))


def count_per_step(step: Callable[[], None], steps: int, warmup: int = 1) -> tuple[float, float, Counter[str]]:
    """(host syncs a step, operators a step, the syncs by name) over ``steps`` calls after ``warmup``."""
    for _ in range(warmup):
        step()
    with SyncCounter() as counter:
        for _ in range(steps):
            step()
    return sum(counter.syncs.values()) / steps, sum(counter.ops.values()) / steps, counter.syncs
