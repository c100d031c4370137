"""Data-parallel plumbing in one place: gather, reduce and share across ranks.

Every collective the engine uses goes through ``Ranks``, so the rest reads as single-process
code: with one process each method returns its input unchanged (no copy, no collective, no
device sync), and with several it calls accelerate's collective. Every rank must call the same
methods in the same order (collectives pair up by order), which is why no method here branches
on the data. ``global_counts`` is the aggregation's normalisers summed over ranks, the one
helper both the trainer and the same-batch lens need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.core import batch_normalizers


@dataclass(frozen=True)
class Ranks:
    """This process's place among the run's processes; accelerator: the run's ``Accelerator``
    (only touched when world > 1)."""

    accelerator: Any
    rank: int = 0
    world: int = 1

    @classmethod
    def of(cls, accelerator) -> "Ranks":
        return cls(accelerator, accelerator.process_index, accelerator.num_processes)

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    def rows(self, batch_rows: int) -> slice:
        """This rank's rows of a gathered tensor whose ranks each hold ``batch_rows`` rows."""
        return slice(self.rank * batch_rows, (self.rank + 1) * batch_rows)

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's tensor concatenated along dim 0 (rank order)."""
        return self.accelerator.gather(tensor.contiguous()) if self.world > 1 else tensor

    def gather_objects(self, items: list) -> list:
        """Every rank's list of picklable objects, concatenated (rank order)."""
        if self.world == 1:
            return items
        from accelerate.utils import gather_object

        return gather_object(items)

    def reduce(self, tensor: torch.Tensor, how: str = "sum") -> torch.Tensor:
        """``tensor`` reduced elementwise over ranks by ``how``: sum, mean, max or min
        (accelerate has no min: -max(-x))."""
        if self.world == 1:
            return tensor
        if how == "min":
            return -self.accelerator.reduce(-tensor, reduction="max")
        return self.accelerator.reduce(tensor, reduction=how)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.reduce(tensor, "sum")


def global_counts(ranks: Ranks, loss_mask: torch.Tensor, completion_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_tokens, num_seqs) of these rows summed over ranks (core.batch_normalizers): tokens of
    the loss mask, sequences of the completion mask (a truncation-masked completion still counts
    as one of the B sequences). loss_mask, completion_mask (B, T) -> two scalars (loss_mask's dtype)."""
    counts = torch.stack([c.to(loss_mask.dtype) for c in batch_normalizers(loss_mask, completion_mask)])
    counts = ranks.sum(counts)
    return counts[0], counts[1]
