"""The batch type passed between the driver and worker groups: tensors, per-sample objects, meta.

`DataProto` mirrors verl's class of the same name (``verl/protocol.py``) so that ported code reads
the same, but it is built on plain dicts instead of tensordict:

- ``batch``: ``dict[str, torch.Tensor]``, every tensor sharing the first (batch) dimension;
- ``non_tensor_batch``: ``dict[str, np.ndarray]`` with the same first dimension (``dtype=object``
  for strings, dicts such as ``reward_model`` / ``extra_info``, ragged lists);
- ``meta_info``: ``dict[str, Any]`` of batch-wide values (temperature, global_step, eos id, metrics).

Conventions (same as verl's):

- ``dp[i]`` with an int returns a :class:`DataProtoItem` (one row: tensors without the batch
  dimension, the raw per-sample objects, the shared meta_info); ``dp[slice]`` and ``dp[indices]``
  (ints or a boolean mask, as a list, numpy array or tensor) return a DataProto.
- Slicing returns views of the tensors and arrays (no copy); index selection copies.
- ``reorder``, ``union``, ``rename`` and ``to`` change the object in place and return it.
- ``concat`` merges meta_info: equal values are kept once, different values are an error, except
  ``meta_info["metrics"]``, which is gathered from every part into one dict of lists (what verl does
  for the metrics each worker returns).

No Ray here: the class is plain Python and pickles with the standard protocol (Ray ships it between
processes); a sliced tensor is copied on pickling so that a chunk carries only its own rows.
"""

from __future__ import annotations

import copy
import math
import os
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = [
    "DataProto",
    "DataProtoItem",
    "pad_dataproto_to_divisor",
    "unpad_dataproto",
]

Index = int | slice | Sequence[int] | Sequence[bool] | np.ndarray | torch.Tensor
METRICS_KEY = "metrics"


@dataclass
class DataProtoItem:
    """One sample of a DataProto: row tensors, per-sample objects and the batch-wide meta_info."""

    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


def _to_object_array(values: Sequence[Any]) -> np.ndarray:
    """Build a 1-D object array with one entry per element (lists and dicts stay whole)."""
    # np.array(list_of_lists, dtype=object) would build a 2-D array when the inner lists have equal
    # lengths; filling an empty 1-D array element by element never does.
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def _deep_equal(a: Any, b: Any) -> bool:
    """Compare two values that may be tensors, arrays, dicts or sequences; NaN equals NaN."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.is_floating_point() or a.is_complex():
            return bool(torch.allclose(a.cpu(), b.cpu(), rtol=0, atol=0, equal_nan=True))
        return bool(torch.equal(a.cpu(), b.cpu()))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape:
            return False
        if a.dtype == object or b.dtype == object:
            return all(_deep_equal(x, y) for x, y in zip(a.ravel(), b.ravel(), strict=True))
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc" and b.dtype.kind in "fc"))
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict)
            and isinstance(b, dict)
            and a.keys() == b.keys()
            and all(_deep_equal(a[k], b[k]) for k in a)
        )
    if isinstance(a, list | tuple) or isinstance(b, list | tuple):
        return (
            type(a) is type(b)
            and len(a) == len(b)
            and all(_deep_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # objects whose == is not a plain bool
        return a is b


def _key_list(keys: str | Sequence[str] | None) -> list[str]:
    """Normalise a key argument: None -> [], one name -> [name], a sequence -> a list."""
    if keys is None:
        return []
    return [keys] if isinstance(keys, str) else list(keys)


def _row_index(indices: Sequence[int] | Sequence[bool] | np.ndarray | torch.Tensor) -> torch.Tensor:
    """Turn row indices or a boolean mask (list, array or tensor) into a flat CPU index tensor."""
    if isinstance(indices, torch.Tensor):
        index = indices.detach().cpu()
    else:
        array = np.asarray(indices)
        index = torch.as_tensor(array if array.size else array.astype(np.int64))
    if index.dtype == torch.bool:
        return index
    if index.is_floating_point() or index.is_complex():
        raise TypeError(f"DataProto row indices must be integers or booleans, got dtype {index.dtype}")
    return index.reshape(-1).to(torch.long)


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """Copy a tensor whose storage holds more than its own elements; return others unchanged."""
    # torch pickles a view together with its whole storage, so a chunk of a batch (a slice) would
    # ship every row of the parent to the rank that receives it; a copy ships only its own rows.
    if tensor.layout != torch.strided or tensor.device.type == "meta":
        return tensor
    if tensor.untyped_storage().nbytes() > tensor.numel() * tensor.element_size():
        return tensor.clone(memory_format=torch.contiguous_format)
    return tensor


def _merge_meta_info(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Merge meta_info dicts: equal values once, conflicts raise, ``metrics`` gathered as verl does."""
    merged: dict[str, Any] = {}
    gathered_metrics: list[dict[str, Any]] = []
    for part_no, meta in enumerate(parts):
        for key, value in meta.items():
            if key == METRICS_KEY:
                if value is None:
                    continue
                gathered_metrics.extend(value if isinstance(value, list) else [value])
            elif key not in merged:
                merged[key] = value
            elif not _deep_equal(merged[key], value):
                raise ValueError(
                    f"DataProto.concat: meta_info[{key!r}] differs between parts "
                    f"({merged[key]!r} vs {value!r} in part {part_no}); make the parts agree on batch-wide "
                    f"values, or pop the key from the parts (dp.pop(meta_info_keys=[{key!r}])) before concat"
                )
    if gathered_metrics:
        metrics: dict[str, list[Any]] = {}
        for worker_metrics in gathered_metrics:
            for name, value in worker_metrics.items():
                metrics.setdefault(name, []).append(value)
        merged[METRICS_KEY] = metrics
    return merged


class DataProto:
    """A batch of samples: tensors and per-sample objects sharing the first dimension, plus meta.

    Construct it with ``DataProto(batch=..., non_tensor_batch=..., meta_info=...)``,
    :meth:`from_dict` or :meth:`from_single_dict`. Lists given as non-tensor values become 1-D
    object arrays (one entry per sample, even when the entries are themselves lists or dicts).
    """

    def __init__(
        self,
        batch: dict[str, torch.Tensor] | None = None,
        non_tensor_batch: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> None:
        self.batch: dict[str, torch.Tensor] = dict(batch) if batch is not None else {}
        self.non_tensor_batch: dict[str, np.ndarray] = (
            dict(non_tensor_batch) if non_tensor_batch is not None else {}
        )
        self.meta_info: dict[str, Any] = dict(meta_info) if meta_info is not None else {}
        self.check_consistency()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> DataProto:
        """Build a DataProto from a dict of tensors, a dict of per-sample values and meta_info."""
        return cls(batch=tensors, non_tensor_batch=non_tensors, meta_info=meta_info)

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info: dict[str, Any] | None = None) -> DataProto:
        """Build a DataProto from one dict, sending tensors to ``batch`` and the rest to non-tensors."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        non_tensors = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls(batch=tensors, non_tensor_batch=non_tensors, meta_info=meta_info)

    def check_consistency(self) -> None:
        """Check types and that every tensor/array has the same first dimension; raise if not.

        Lists and tuples in ``non_tensor_batch`` are converted to 1-D object arrays in place.
        """
        for key, value in self.batch.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"DataProto.batch[{key!r}] is a {type(value).__name__}, not a torch.Tensor; convert it "
                    f"(torch.as_tensor) or put per-sample Python objects into non_tensor_batch"
                )
            if value.dim() == 0:
                raise ValueError(
                    f"DataProto.batch[{key!r}] is a 0-dim tensor; batch tensors need a leading batch "
                    f"dimension (put batch-wide scalars into meta_info)"
                )
        for key, raw in list(self.non_tensor_batch.items()):
            entry: Any = raw
            if isinstance(entry, list | tuple):
                entry = _to_object_array(entry)
                self.non_tensor_batch[key] = entry
            if isinstance(entry, torch.Tensor):
                raise TypeError(
                    f"DataProto.non_tensor_batch[{key!r}] is a torch.Tensor; put tensors into batch instead"
                )
            if not isinstance(entry, np.ndarray):
                raise TypeError(
                    f"DataProto.non_tensor_batch[{key!r}] is a {type(entry).__name__}; it must be a numpy "
                    f"array or list with one entry per sample (put batch-wide values into meta_info)"
                )
            if entry.ndim == 0:
                raise ValueError(
                    f"DataProto.non_tensor_batch[{key!r}] is a 0-dim array; it needs one entry per sample "
                    f"(put batch-wide values into meta_info)"
                )
        if not isinstance(self.meta_info, dict):
            raise TypeError(f"DataProto.meta_info must be a dict, got {type(self.meta_info).__name__}")
        lengths = [(f"batch[{k!r}]", int(v.shape[0])) for k, v in self.batch.items()]
        lengths += [(f"non_tensor_batch[{k!r}]", int(v.shape[0])) for k, v in self.non_tensor_batch.items()]
        if not lengths:
            return
        ref_name, ref_len = lengths[0]
        for name, length in lengths[1:]:
            if length != ref_len:
                raise ValueError(
                    f"DataProto: {name} has {length} rows but {ref_name} has {ref_len}; every tensor in "
                    f"batch and every array in non_tensor_batch must share the first (batch) dimension"
                )

    # ------------------------------------------------------------------ size and access
    def __len__(self) -> int:
        """Number of samples (0 when there are no tensor or non-tensor keys)."""
        for tensor in self.batch.values():
            return int(tensor.shape[0])
        for array in self.non_tensor_batch.values():
            return int(array.shape[0])
        return 0

    @property
    def batch_size(self) -> int:
        """Number of samples, the same as ``len(dp)``."""
        return len(self)

    def __getitem__(self, item: Index) -> DataProto | DataProtoItem:
        """Return one row as a DataProtoItem (int), or a DataProto for a slice or row indices."""
        if isinstance(item, torch.Tensor) and item.dim() == 0 and not item.dtype == torch.bool:
            item = int(item.item())
        if isinstance(item, int | np.integer):
            return self._item(int(item))
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, list | tuple | np.ndarray | torch.Tensor):
            return self.select_idxs(item)
        raise TypeError(
            f"DataProto indices must be an int, a slice, or a list/array/tensor of row indices or a "
            f"boolean mask, not {type(item).__name__}"
        )

    def __iter__(self) -> Iterator[DataProtoItem]:
        """Iterate over the samples as DataProtoItems."""
        for i in range(len(self)):
            yield self._item(i)

    def _item(self, index: int) -> DataProtoItem:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"DataProto index {index} is out of range for a batch of {n} samples")
        return DataProtoItem(
            batch={k: v[index] for k, v in self.batch.items()},
            non_tensor_batch={k: v[index] for k, v in self.non_tensor_batch.items()},
            meta_info=self.meta_info,
        )

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = 1) -> DataProto:
        """Rows ``start:end:step`` as a new DataProto whose tensors/arrays are views of this one's."""
        sl = slice(start, end, step)
        if sl.step is not None and sl.step <= 0:
            raise ValueError(f"DataProto.slice needs a positive step, got {sl.step}; use reorder to reverse")
        return type(self)(
            batch={k: v[sl] for k, v in self.batch.items()},
            non_tensor_batch={k: v[sl] for k, v in self.non_tensor_batch.items()},
            meta_info=self.meta_info,
        )

    def select_idxs(self, idxs: Sequence[int] | Sequence[bool] | np.ndarray | torch.Tensor) -> DataProto:
        """Rows picked by integer indices or a boolean mask, copied into a new DataProto."""
        index = _row_index(idxs)
        n = len(self)
        if index.dtype == torch.bool:
            if index.dim() != 1 or index.numel() != n:
                raise IndexError(
                    f"DataProto boolean mask has shape {tuple(index.shape)} but the batch has {n} samples"
                )
            index = index.nonzero().flatten()
        if index.numel() and (int(index.max()) >= n or int(index.min()) < -n):
            raise IndexError(
                f"DataProto row index out of range: indices span [{int(index.min())}, {int(index.max())}] "
                f"but the batch has {n} samples"
            )
        np_index = index.numpy()
        return type(self)(
            batch={k: v[index.to(v.device)] for k, v in self.batch.items()},
            non_tensor_batch={k: v[np_index] for k, v in self.non_tensor_batch.items()},
            meta_info=self.meta_info,
        )

    # ------------------------------------------------------------------ keys
    @staticmethod
    def _check_keys(kind: str, wanted: Sequence[str], available: dict[str, Any]) -> None:
        missing = [k for k in wanted if k not in available]
        if missing:
            raise KeyError(f"DataProto has no {kind} key(s) {missing}; available: {sorted(available)}")

    def select(
        self,
        batch_keys: str | Sequence[str] | None = None,
        non_tensor_batch_keys: str | Sequence[str] | None = None,
        meta_info_keys: str | Sequence[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """A DataProto with only the given keys (None keeps all); ``deepcopy`` copies the values too."""
        batch_keys = list(self.batch) if batch_keys is None else _key_list(batch_keys)
        nt_keys = (
            list(self.non_tensor_batch) if non_tensor_batch_keys is None else _key_list(non_tensor_batch_keys)
        )
        meta_keys = list(self.meta_info) if meta_info_keys is None else _key_list(meta_info_keys)
        self._check_keys("batch", batch_keys, self.batch)
        self._check_keys("non_tensor_batch", nt_keys, self.non_tensor_batch)
        self._check_keys("meta_info", meta_keys, self.meta_info)
        batch = {k: self.batch[k] for k in batch_keys}
        non_tensor = {k: self.non_tensor_batch[k] for k in nt_keys}
        meta = {k: self.meta_info[k] for k in meta_keys}
        if deepcopy:
            batch = {k: v.clone() for k, v in batch.items()}
            non_tensor = copy.deepcopy(non_tensor)
            meta = copy.deepcopy(meta)
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def pop(
        self,
        batch_keys: str | Sequence[str] | None = None,
        non_tensor_batch_keys: str | Sequence[str] | None = None,
        meta_info_keys: str | Sequence[str] | None = None,
    ) -> DataProto:
        """Remove the given keys (None removes none) from this DataProto and return them as a new one."""
        batch_keys = _key_list(batch_keys)
        nt_keys = _key_list(non_tensor_batch_keys)
        meta_keys = _key_list(meta_info_keys)
        self._check_keys("batch", batch_keys, self.batch)
        self._check_keys("non_tensor_batch", nt_keys, self.non_tensor_batch)
        self._check_keys("meta_info", meta_keys, self.meta_info)
        return type(self)(
            batch={k: self.batch.pop(k) for k in batch_keys},
            non_tensor_batch={k: self.non_tensor_batch.pop(k) for k in nt_keys},
            meta_info={k: self.meta_info.pop(k) for k in meta_keys},
        )

    def rename(self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> DataProto:
        """Rename ``batch`` keys in place (a name or a list of names each); return self."""
        old = _key_list(old_keys)
        new = _key_list(new_keys)
        if len(old) != len(new):
            raise ValueError(
                f"DataProto.rename got {len(old)} old keys but {len(new)} new keys: {old} -> {new}"
            )
        self._check_keys("batch", old, self.batch)
        clashes = [k for k in new if k in self.batch and k not in old]
        if clashes or len(set(new)) != len(new):
            raise ValueError(
                f"DataProto.rename would overwrite or duplicate batch key(s) {clashes or new}; "
                f"pop them first or pick other names"
            )
        values = [self.batch.pop(k) for k in old]
        self.batch.update(zip(new, values, strict=True))
        return self

    def union(self, other: DataProto) -> DataProto:
        """Merge another DataProto's keys into this one in place; shared keys must hold equal values."""
        if self._has_rows() and other._has_rows() and len(self) != len(other):
            raise ValueError(
                f"DataProto.union: batch sizes differ ({len(self)} vs {len(other)}); union merges columns "
                f"of the same samples, use DataProto.concat to append rows"
            )
        for kind, mine, theirs in (
            ("batch", self.batch, other.batch),
            ("non_tensor_batch", self.non_tensor_batch, other.non_tensor_batch),
            ("meta_info", self.meta_info, other.meta_info),
        ):
            for key, value in theirs.items():
                if key in mine and mine[key] is not value and not _deep_equal(mine[key], value):
                    raise ValueError(
                        f"DataProto.union: {kind}[{key!r}] holds different values in the two DataProtos; "
                        f"rename or pop one of them before union"
                    )
        self.batch.update(other.batch)
        self.non_tensor_batch.update(other.non_tensor_batch)
        self.meta_info.update(other.meta_info)
        return self

    def _has_rows(self) -> bool:
        return bool(self.batch or self.non_tensor_batch)

    # ------------------------------------------------------------------ splitting and joining
    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into ``chunks`` equal parts in order; the length must divide evenly."""
        if not isinstance(chunks, int) or chunks < 1:
            raise ValueError(f"DataProto.chunk needs a positive int number of chunks, got {chunks!r}")
        n = len(self)
        if n % chunks != 0:
            raise ValueError(
                f"DataProto.chunk: {n} samples do not split into {chunks} equal chunks; pad first with "
                f"pad_dataproto_to_divisor(data, {chunks}) and unpad_dataproto the gathered result"
            )
        size = n // chunks
        return [self.slice(i * size, (i + 1) * size) for i in range(chunks)]

    def split(self, split_size: int) -> list[DataProto]:
        """Split into parts of ``split_size`` samples in order; the last part may be smaller."""
        if not isinstance(split_size, int) or split_size < 1:
            raise ValueError(f"DataProto.split needs a positive int split_size, got {split_size!r}")
        n = len(self)
        if n == 0:
            return [self.slice(0, 0)]
        return [self.slice(start, start + split_size) for start in range(0, n, split_size)]

    def make_iterator(
        self,
        mini_batch_size: int,
        epochs: int,
        seed: int | None = None,
        dataloader_kwargs: dict[str, Any] | None = None,
    ) -> Iterator[DataProto]:
        """Yield mini-batches of ``mini_batch_size`` rows for ``epochs`` passes (verl's signature).

        Of ``dataloader_kwargs`` only ``shuffle`` is honoured: with ``shuffle=True`` every epoch
        draws a new row order from a generator seeded with ``seed`` (reproducible when set).
        """
        options = dict(dataloader_kwargs or {})
        shuffle = bool(options.pop("shuffle", False))
        if options:
            raise ValueError(
                f"DataProto.make_iterator supports only dataloader_kwargs={{'shuffle': bool}}, got extra "
                f"{sorted(options)}; drop them"
            )
        n = len(self)
        if not isinstance(mini_batch_size, int) or mini_batch_size < 1 or n % mini_batch_size != 0:
            raise ValueError(
                f"DataProto.make_iterator: mini_batch_size={mini_batch_size!r} must be a positive int that "
                f"divides the batch size {n}; pick a divisor or use dp.split for a smaller last part"
            )
        if not isinstance(epochs, int) or epochs < 0:
            raise ValueError(f"DataProto.make_iterator needs a non-negative int epochs, got {epochs!r}")
        generator = torch.Generator()
        if seed is not None:
            generator.manual_seed(seed)
        return self._iterate(mini_batch_size, epochs, shuffle, generator)

    def _iterate(
        self, mini_batch_size: int, epochs: int, shuffle: bool, generator: torch.Generator
    ) -> Iterator[DataProto]:
        n = len(self)
        for _ in range(epochs):
            order = torch.randperm(n, generator=generator) if shuffle else None
            for start in range(0, n, mini_batch_size):
                if order is None:
                    yield self.slice(start, start + mini_batch_size)
                else:
                    yield self.select_idxs(order[start : start + mini_batch_size])

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Append the rows of several DataProtos with the same keys; meta_info is merged."""
        if len(data) == 0:
            raise ValueError("DataProto.concat needs at least one DataProto, got an empty list")
        first = data[0]
        for i, part in enumerate(data[1:], start=1):
            for kind, ref, got in (
                ("batch", first.batch, part.batch),
                ("non_tensor_batch", first.non_tensor_batch, part.non_tensor_batch),
            ):
                if ref.keys() != got.keys():
                    raise ValueError(
                        f"DataProto.concat: part {i} has {kind} keys {sorted(got)} but part 0 has "
                        f"{sorted(ref)}; select or pop keys so that every part has the same ones"
                    )
        batch: dict[str, torch.Tensor] = {}
        for key in first.batch:
            try:
                batch[key] = torch.cat([part.batch[key] for part in data], dim=0)
            except RuntimeError as err:
                shapes = [tuple(part.batch[key].shape) for part in data]
                raise ValueError(
                    f"DataProto.concat: batch[{key!r}] cannot be concatenated (shapes {shapes}); pad the "
                    f"parts to the same trailing shape first"
                ) from err
        non_tensor = {
            key: np.concatenate([part.non_tensor_batch[key] for part in data], axis=0)
            for key in first.non_tensor_batch
        }
        meta = _merge_meta_info([part.meta_info for part in data])
        return type(first)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def reorder(self, indices: torch.Tensor | np.ndarray | Sequence[int]) -> DataProto:
        """Permute the rows in place (``new[i] = old[indices[i]]``); return self."""
        index = _row_index(indices)
        n = len(self)
        if (
            index.dtype == torch.bool
            or index.numel() != n
            or not torch.equal(torch.sort(index).values, torch.arange(n))
        ):
            raise ValueError(
                f"DataProto.reorder needs a permutation of range({n}), got {index.numel()} indices "
                f"{index.tolist()[:10]}...; to pick a subset of rows use dp[indices]"
            )
        np_index = index.numpy()
        for key, value in self.batch.items():
            self.batch[key] = value[index.to(value.device)]
        for key, array in self.non_tensor_batch.items():
            self.non_tensor_batch[key] = array[np_index]
        return self

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Repeat every row ``repeat_times`` times: ``a a b b`` when interleaved, else ``a b a b``."""
        if not isinstance(repeat_times, int) or repeat_times < 0:
            raise ValueError(f"DataProto.repeat needs a non-negative int repeat_times, got {repeat_times!r}")
        if interleave:
            batch = {k: v.repeat_interleave(repeat_times, dim=0) for k, v in self.batch.items()}
            non_tensor = {k: np.repeat(v, repeat_times, axis=0) for k, v in self.non_tensor_batch.items()}
        else:
            # Tiling the whole batch; [v] * 0 would leave nothing to concatenate, hence v[:0].
            batch = {
                k: torch.cat([v] * repeat_times) if repeat_times else v[:0] for k, v in self.batch.items()
            }
            non_tensor = {
                k: np.concatenate([v] * repeat_times) if repeat_times else v[:0]
                for k, v in self.non_tensor_batch.items()
            }
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=self.meta_info)

    # ------------------------------------------------------------------ copies and devices
    def to(self, device: str | torch.device) -> DataProto:
        """Move every tensor to ``device`` in place; return self."""
        self.batch = {k: v.to(device) for k, v in self.batch.items()}
        return self

    def clone(self) -> DataProto:
        """A deep copy: tensors cloned, non-tensor arrays and meta_info deep-copied."""
        return self.select(deepcopy=True)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle state with every tensor compacted to its own rows (see `_compact`)."""
        state = dict(self.__dict__)
        state["batch"] = {k: _compact(v) for k, v in self.batch.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore from `__getstate__`'s dict."""
        self.__dict__.update(state)

    def save_to_disk(self, path: str | os.PathLike[str]) -> None:
        """Write this DataProto to a local file with pickle (a debugging aid, as in verl)."""
        with open(path, "wb") as f:
            pickle.dump(self, f)

    @staticmethod
    def load_from_disk(path: str | os.PathLike[str]) -> DataProto:
        """Read a DataProto written by `save_to_disk` (pickle: only load files you wrote yourself)."""
        with open(path, "rb") as f:
            data = pickle.load(f)
        if not isinstance(data, DataProto):
            raise TypeError(f"{path} holds a {type(data).__name__}, not a DataProto written by save_to_disk")
        return data

    def __repr__(self) -> str:
        """Summarise the keys with dtypes and shapes."""
        tensors = ", ".join(
            f"{k}: {str(v.dtype).removeprefix('torch.')}{list(v.shape)}" for k, v in self.batch.items()
        )
        arrays = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self.non_tensor_batch.items())
        return (
            f"{type(self).__name__}(batch_size={len(self)}, batch={{{tensors}}}, "
            f"non_tensor_batch={{{arrays}}}, meta_info_keys={list(self.meta_info)})"
        )


def response_mask_of(data: DataProto) -> torch.Tensor:
    """The (b, R) mask of valid response tokens: `response_mask`, or the response part of `attention_mask`."""
    if "response_mask" in data.batch:
        return data.batch["response_mask"]
    response_length = data.batch["responses"].shape[-1]
    return data.batch["attention_mask"][:, -response_length:]


def response_lengths_of(data: DataProto) -> torch.Tensor:
    """(b,) length of each response up to its last model token (the last 1 of `response_mask`): the mask's
    sum for a single-turn response, and the whole trajectory, tool turns included, for a multi-turn one
    (whose last turn is always the model's)."""
    mask = response_mask_of(data)
    positions = torch.arange(1, mask.shape[-1] + 1, device=mask.device).expand_as(mask)
    return (positions * (mask != 0)).max(dim=-1).values


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Pad ``data`` to a multiple of ``size_divisor`` rows by repeating rows from the start.

    Returns ``(padded, pad_size)``; ``pad_size`` is 0 (and ``data`` itself returned) when the length
    already divides. Undo with :func:`unpad_dataproto` on the gathered output.
    """
    if not isinstance(size_divisor, int) or size_divisor < 1:
        raise ValueError(f"pad_dataproto_to_divisor needs a positive int size_divisor, got {size_divisor!r}")
    n = len(data)
    pad_size = (-n) % size_divisor
    if pad_size == 0:  # also the case for an empty DataProto: 0 divides by anything
        return data, 0
    # Cycle through the rows from the start when more padding than rows is needed (as verl does).
    index = torch.cat([torch.arange(n), torch.arange(pad_size) % n])
    padded = data.select_idxs(index)
    return padded, pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last ``pad_size`` rows added by :func:`pad_dataproto_to_divisor`."""
    if pad_size < 0 or pad_size > len(data):
        raise ValueError(f"unpad_dataproto: pad_size must be in [0, {len(data)}], got {pad_size}")
    if pad_size == 0:
        return data
    return data.slice(0, len(data) - pad_size)
