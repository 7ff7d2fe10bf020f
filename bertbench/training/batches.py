"""Training batches: the streams the loop reads, each resumable at any batch (its state goes into checkpoints)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import torch


class ShuffledBatches:
    """An endless stream of training batches from in-memory features, resumable at any batch.

    The order is one seeded permutation per epoch, the epochs laid end to end and cut into global batches of
    `batch_size * world_size` (TF's shuffle, repeat, batch with drop_remainder: every batch full, every example
    seen once per epoch). Rank r takes the r-th slice of each global batch. The state is the number of examples
    consumed, so a resumed stream continues with the very next batch.
    """

    def __init__(
        self, features: Mapping[str, torch.Tensor], batch_size: int, seed: int, rank: int = 0, world_size: int = 1
    ):
        counts = {len(tensor) for tensor in features.values()}
        if len(counts) != 1 or not counts.pop():
            raise ValueError("features must be tensors of one non-zero length")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.features = dict(features)
        self.num_examples = len(next(iter(features.values())))
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.consumed = 0
        self._orders: dict[int, torch.Tensor] = {}

    @property
    def epoch(self) -> float:
        """Epochs consumed so far, fractional."""
        return self.consumed / self.num_examples

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._orders = {e: order for e, order in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = torch.randperm(self.num_examples, generator=generator)
        return self._orders[epoch]

    def _indices(self, start: int, count: int) -> torch.Tensor:
        pieces = []
        while count:
            epoch, offset = divmod(start, self.num_examples)
            take = min(count, self.num_examples - offset)
            pieces.append(self._order(epoch)[offset : offset + take])
            start, count = start + take, count - take
        return torch.cat(pieces)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        start = self.consumed + self.rank * self.batch_size
        index = self._indices(start, self.batch_size)
        self.consumed += self.batch_size * self.world_size
        return {name: tensor[index] for name, tensor in self.features.items()}

    def state_dict(self) -> dict[str, int]:
        return {"consumed": self.consumed, "num_examples": self.num_examples, "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        for key in ("num_examples", "seed"):
            if state[key] != getattr(self, key):
                raise ValueError(f"the data order was saved with {key} {state[key]}, this run has {getattr(self, key)}")
        self.consumed = state["consumed"]


class TrainBatches(Protocol):
    """What `Estimator.train` reads batches from: an endless iterator whose position a checkpoint saves and a
    resumed run restores (ShuffledBatches; tasks.pretraining.PretrainingBatches reads shard files)."""

    epoch: float

    def __next__(self) -> dict[str, torch.Tensor]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...
