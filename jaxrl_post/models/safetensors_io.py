"""Reads safetensors checkpoints one tensor at a time, memory-mapped.

The `safetensors` package's numpy reader cannot return bfloat16 (most LM
checkpoints), so reading parses the format directly: an 8-byte little-endian
header length, a JSON header `{name: {dtype, shape, data_offsets}}`, then the
raw bytes. Tensors are views into an `mmap`, so a checkpoint is never held in
host memory as a whole; each tensor is copied only when converted.
Writing uses `safetensors.numpy.save_file`, which handles bfloat16 through
`ml_dtypes`.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Mapping
from pathlib import Path

import ml_dtypes
import numpy as np

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

DTYPES = {
  "F64": np.dtype(np.float64),
  "F32": np.dtype(np.float32),
  "F16": np.dtype(np.float16),
  "BF16": np.dtype(ml_dtypes.bfloat16),
  "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
  "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
  "I64": np.dtype(np.int64),
  "I32": np.dtype(np.int32),
  "I16": np.dtype(np.int16),
  "I8": np.dtype(np.int8),
  "U8": np.dtype(np.uint8),
  "BOOL": np.dtype(np.bool_),
}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


class CheckpointError(ValueError):
  """A checkpoint directory or file that cannot be loaded as asked."""


class SafetensorsFile:
  """One `.safetensors` file: header parsed eagerly, tensors read lazily."""

  def __init__(self, path: str | os.PathLike):
    self.path = Path(path)
    with open(self.path, "rb") as f:
      raw_len = f.read(8)
      if len(raw_len) != 8:
        raise CheckpointError(f"{self.path}: not a safetensors file (shorter than 8 bytes)")
      (header_len,) = struct.unpack("<Q", raw_len)
      size = os.fstat(f.fileno()).st_size
      if header_len > size - 8:
        raise CheckpointError(f"{self.path}: header length {header_len} exceeds the file size")
      try:
        header = json.loads(f.read(header_len))
      except json.JSONDecodeError as e:
        raise CheckpointError(f"{self.path}: header is not valid JSON ({e})") from None
    self.metadata = header.pop("__metadata__", None) or {}
    self._entries: dict[str, dict] = header
    self._data_start = 8 + header_len
    self._size = size
    self._mmap: mmap.mmap | None = None

  def names(self) -> list[str]:
    return list(self._entries)

  def dtype_and_shape(self, name: str) -> tuple[str, tuple[int, ...]]:
    entry = self._entries[name]
    return entry["dtype"], tuple(entry["shape"])

  def read(self, name: str) -> np.ndarray:
    """The tensor `name` as a read-only numpy view into the mapped file."""
    entry = self._entries[name]
    dtype_name, shape = entry["dtype"], tuple(entry["shape"])
    if dtype_name not in DTYPES:
      raise CheckpointError(f"{self.path}: tensor {name!r} has unknown dtype {dtype_name}")
    dtype = DTYPES[dtype_name]
    begin, end = entry["data_offsets"]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if end - begin != expected or self._data_start + end > self._size:
      raise CheckpointError(
        f"{self.path}: tensor {name!r} byte range [{begin}, {end}) does not match "
        f"shape {list(shape)} of {dtype_name} or the file size")
    if self._mmap is None:
      with open(self.path, "rb") as f:
        self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    count = expected // dtype.itemsize
    array = np.frombuffer(self._mmap, dtype=dtype, count=count, offset=self._data_start + begin)
    return array.reshape(shape)

  def read_slice(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
    """A copy of the block `index` (one unit-step slice per dimension) of tensor `name`.

    Only the pages that hold the block are touched: the slice is taken on the
    memory-mapped view, and the copy gathers its rows. This is what sharded
    loading reads, so a host never copies more of a tensor than its devices
    hold.
    """
    return np.array(self.read(name)[_check_index(name, index, self.dtype_and_shape(name)[1])])


class CheckpointReader:
  """All tensors of a Hugging Face checkpoint directory, single-file or sharded."""

  def __init__(self, directory: str | os.PathLike):
    self.directory = Path(directory)
    index_path = self.directory / INDEX_FILE
    single_path = self.directory / SINGLE_FILE
    self._files: dict[str, SafetensorsFile] = {}
    self._where: dict[str, str] = {}
    if index_path.exists():
      try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
      except (json.JSONDecodeError, KeyError) as e:
        raise CheckpointError(f"{index_path}: not a valid safetensors index ({e!r})") from None
      for file_name in sorted(set(weight_map.values())):
        if not (self.directory / file_name).exists():
          raise CheckpointError(f"{index_path} lists shard {file_name}, which does not exist")
      for name, file_name in weight_map.items():
        self._where[name] = file_name
    elif single_path.exists():
      for name in self._open(SINGLE_FILE).names():
        self._where[name] = SINGLE_FILE
    else:
      raise CheckpointError(
        f"{self.directory}: no {SINGLE_FILE} or {INDEX_FILE} (only safetensors weights are read)")

  def _open(self, file_name: str) -> SafetensorsFile:
    if file_name not in self._files:
      self._files[file_name] = SafetensorsFile(self.directory / file_name)
    return self._files[file_name]

  def names(self) -> list[str]:
    return list(self._where)

  def _file_for(self, name: str) -> SafetensorsFile:
    file = self._open(self._where[name])
    if name not in file._entries:
      raise CheckpointError(f"tensor {name!r} is listed in {INDEX_FILE} but absent from "
                            f"{self._where[name]}")
    return file

  def dtype_and_shape(self, name: str) -> tuple[str, tuple[int, ...]]:
    return self._file_for(name).dtype_and_shape(name)

  def read(self, name: str) -> np.ndarray:
    return self._file_for(name).read(name)

  def read_slice(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
    """A copy of the block `index` of tensor `name` (see `SafetensorsFile.read_slice`)."""
    return self._file_for(name).read_slice(name, index)


def _check_index(name: str, index: tuple[slice, ...], shape: tuple[int, ...]
                 ) -> tuple[slice, ...]:
  """`index` as in-bounds unit-step slices, one per dimension of `shape`."""
  if len(index) != len(shape):
    raise ValueError(f"tensor {name!r} of shape {list(shape)}: index {index} has "
                     f"{len(index)} entries, expected {len(shape)}")
  out = []
  for s, size in zip(index, shape):
    if not isinstance(s, slice) or s.step not in (None, 1):
      raise ValueError(f"tensor {name!r}: index {index} must be unit-step slices")
    start, stop, _ = s.indices(size)
    if not (s.start is None or 0 <= s.start <= size) or not (s.stop is None or s.stop <= size):
      raise ValueError(f"tensor {name!r} of shape {list(shape)}: slice {s} is out of bounds")
    out.append(slice(start, stop))
  return tuple(out)


def write_checkpoint(directory: str | os.PathLike, tensors: Mapping[str, np.ndarray], *,
                     max_shard_bytes: int | None = None) -> list[str]:
  """Writes `tensors` as `model.safetensors`, or as shards plus an index.

  Args:
    directory: output directory (created).
    tensors: name → numpy array (bfloat16 via `ml_dtypes`).
    max_shard_bytes: if set and the tensors exceed it, split into
      `model-0000i-of-0000n.safetensors` files of at most this size (a single
      tensor larger than the limit gets its own shard), with an index.

  Returns:
    The file names written.
  """
  from safetensors.numpy import save_file  # Lazy: only writing needs it.

  directory = Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  metadata = {"format": "pt"}  # transformers refuses files without a format tag.
  total = sum(t.nbytes for t in tensors.values())
  if max_shard_bytes is None or total <= max_shard_bytes:
    save_file(dict(tensors), str(directory / SINGLE_FILE), metadata=metadata)
    return [SINGLE_FILE]
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name, tensor in tensors.items():
    if shards[-1] and size + tensor.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = tensor
    size += tensor.nbytes
  files, weight_map = [], {}
  for i, shard in enumerate(shards):
    file_name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, str(directory / file_name), metadata=metadata)
    files.append(file_name)
    weight_map.update({name: file_name for name in shard})
  index = {"metadata": {"total_size": total}, "weight_map": weight_map}
  (directory / INDEX_FILE).write_text(json.dumps(index, indent=2))
  return files + [INDEX_FILE]
