"""A resumable batch loader: per-epoch shuffles seeded by (seed, epoch) and a saveable position.

One pass of ``for batch in loader`` is one epoch (or its remainder after a resume). The state is the
epoch and the number of batches already handed out in it; because each epoch's order depends only on
(seed, epoch), a loader restored from `state_dict` yields exactly the batches the original would have
yielded next: nothing repeated, nothing skipped.

With a user sampler (verl's `data.sampler`) the sampler gives the order instead: indices are drawn from
it batch by batch (so a curriculum sampler's `update(batch)` after a step shapes the batches that follow),
an epoch ends when it is exhausted or after ``len(sampler) // batch_size`` batches, and a resume restores
the sampler's own `state_dict` when it has one, else replays its order up to the saved position (exact for
samplers whose order depends only on their own seed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from hybridflow.data.dataset import collate_fn as default_collate_fn


class StatefulDataLoader:
    """Iterate batches of ``batch_size`` items with seeded per-epoch shuffling and resumable state."""

    def __init__(
        self,
        dataset: Sequence[Any],
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        collate_fn: Callable[[list[Any]], Any] = default_collate_fn,
        sampler: Any = None,
    ) -> None:
        """Set up at epoch 0, position 0; ``len(loader)`` is the number of batches per epoch."""
        if batch_size < 1:
            raise ValueError(f"batch size must be at least 1, got {batch_size}.")
        if drop_last and len(dataset) < batch_size:
            raise ValueError(
                f"the dataset has {len(dataset)} prompts, fewer than one batch of {batch_size} "
                "(data.train_batch_size); lower the batch size or add data."
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.sampler = sampler
        self._epoch = 0
        self._position = 0  # batches already handed out in the current epoch
        self._replay = False  # resumed mid-epoch with a sampler that keeps no state: skip to the position

    @classmethod
    def from_config(cls, cfg: Any, dataset: Sequence[Any], **kwargs: Any) -> StatefulDataLoader:
        """Training loader from ``cfg.data`` (``gen_batch_size`` or ``train_batch_size``, ``shuffle``, ``seed``,
        ``sampler``), read by attribute."""
        data = cfg.data
        seed = getattr(data, "seed", None)
        if "sampler" not in kwargs and getattr(data, "sampler", None) is not None:
            from hybridflow.data.external import build_sampler

            kwargs["sampler"] = build_sampler(cfg, dataset)
        return cls(
            dataset,
            getattr(data, "gen_batch_size", None) or data.train_batch_size,
            shuffle=getattr(data, "shuffle", True),
            seed=seed if seed is not None else 0,
            **kwargs,
        )

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self._epoch

    def __len__(self) -> int:
        """Batches per epoch."""
        n = len(self.sampler) if self.sampler is not None else len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The item order of ``epoch``: a permutation seeded by (seed, epoch), or 0..n-1 without shuffle."""
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def __iter__(self) -> Iterator[Any]:
        """Yield the rest of the current epoch; the state advances as each batch is handed out, and moves
        to the next epoch right after its last batch."""
        if self.sampler is not None:
            yield from self._iter_sampler()
            return
        order = self.epoch_order(self._epoch)
        num_batches = len(self)
        while self._position < num_batches:
            start = self._position * self.batch_size
            indices = order[start : start + self.batch_size]
            batch = self.collate_fn([self.dataset[int(i)] for i in indices])
            self._position += 1
            if self._position == num_batches:
                self._epoch, self._position = self._epoch + 1, 0
                yield batch
                return
            yield batch

    def _iter_sampler(self) -> Iterator[Any]:
        """The rest of the epoch in the user sampler's order, drawn batch by batch."""
        indices = iter(self.sampler)
        if self._replay:  # a resume without sampler state: skip what the saved run already handed out
            for _ in range(self._position * self.batch_size):
                next(indices, None)
            self._replay = False
        num_batches = len(self)
        while self._position < num_batches:
            chosen = [int(i) for _, i in zip(range(self.batch_size), indices, strict=False)]
            if len(chosen) < self.batch_size and (self.drop_last or not chosen):
                break  # the sampler ran out early: the epoch ends here
            self._position += 1
            if self._position == num_batches:
                self._epoch, self._position = self._epoch + 1, 0
            yield self.collate_fn([self.dataset[i] for i in chosen])
            if self._position == 0:
                return
        self._epoch, self._position = self._epoch + 1, 0

    def update_sampler(self, batch: Any) -> bool:
        """Give a curriculum sampler (one with ``update(batch)``, verl's AbstractCurriculumSampler) a step's
        scored batch; False when there is none."""
        update = getattr(self.sampler, "update", None)
        if not callable(update):
            return False
        update(batch=batch)
        return True

    def state_dict(self) -> dict[str, Any]:
        """The position to resume from, plus what must match for it to mean the same samples."""
        if self.sampler is not None:
            own = getattr(self.sampler, "state_dict", None)
            return {
                "epoch": self._epoch,
                "position": self._position,
                "batch_size": self.batch_size,
                "dataset_len": len(self.dataset),
                "sampler": type(self.sampler).__name__,
                "sampler_state": own() if callable(own) else None,
            }
        return {
            "epoch": self._epoch,
            "position": self._position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "dataset_len": len(self.dataset),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from `state_dict`; refuse if the data, batch size, seed, shuffling or sampler changed."""
        current = self.state_dict()
        for key in ("dataset_len", "batch_size", "seed", "shuffle", "sampler"):
            if key in state and state[key] != current[key]:
                raise ValueError(
                    f"cannot resume the dataloader: the checkpoint has {key}={state[key]!r} but this run has "
                    f"{key}={current[key]!r}, so the saved position would point at different samples. "
                    "Resume with the same data and data.* settings, or start a fresh run."
                )
        if not 0 <= int(state["position"]) < max(len(self), 1):
            raise ValueError(f"dataloader state position={state['position']} is outside 0..{len(self) - 1}.")
        self._epoch = int(state["epoch"])
        self._position = int(state["position"])
        if self.sampler is not None:
            load = getattr(self.sampler, "load_state_dict", None)
            if state.get("sampler_state") is not None and callable(load):
                load(state["sampler_state"])
            else:
                self._replay = self._position > 0
