"""The prepared-data format: TFRecord shards of tokenized documents plus `metadata.json`.

One record = one document, a `tf.train.Example` with two int64 lists:
    token_ids         the document's tokens, all sentences concatenated
    sentence_lengths  tokens per sentence (sums to len(token_ids))
and, in data prepared with a word segmenter (`prepare --word-segmenter`, segment.py), a third:
    word_lengths      tokens per segmented word (sums to len(token_ids))
which readers ignore unless asked for it (`words=True`), so a reader of the two lists reads
both kinds of data, and data prepared before it is read as before.
Shards are `train-00003-of-00016.tfrecord` and `eval-00000-of-00001.tfrecord`. With
`prepare --num-workers W`, worker k writes its own shards (global index k*N + i of W*N) and
`metadata-0000k-of-0000W.json`; `load_metadata` merges them, so hosts can prepare in parallel.
The files are standard: the stream reads them with tf.data (tf_reader.py). This module writes
them with numpy, so preparation never starts TensorFlow, and reads them in plain Python for the
stream's TensorFlow-free reader (`InputConfig.reader="python"`) and for inspection. Directories
and files go through `bertjax.runtime.fs` (etils.epath): a local one with Python's own file
calls, a `gs://` one through TensorFlow's file systems.
"""

from __future__ import annotations

import collections
import json
import os
from typing import Iterator

import google_crc32c
import numpy as np
from etils import epath

from bertjax import errors, schema
from bertjax.data import corpus, tokenizer as tokenizer_lib
from bertjax.runtime import fs

FORMAT_VERSION = 1
SPLITS = ("train", "eval")
# The fix for a damaged shard or metadata file, appended to its error.
_REPREPARE = " — copy it again, or prepare the data again with `bertjax prepare ... --overwrite`"


def shard_name(split: str, index: int, total: int) -> str:
  return f"{split}-{index:05d}-of-{total:05d}.tfrecord"


def metadata_name(worker_index: int, num_workers: int) -> str:
  if num_workers == 1:
    return "metadata.json"
  return f"metadata-{worker_index:05d}-of-{num_workers:05d}.json"


def crc32c(data: bytes) -> int:
  """CRC-32C (Castagnoli), as TFRecord frames use (google-crc32c's C implementation)."""
  return google_crc32c.value(data)


def _masked_crc(data: bytes) -> bytes:
  crc = crc32c(data)
  return ((((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF).to_bytes(4, "little")


def frame_record(data: bytes) -> bytes:
  """One TFRecord: length, masked CRC of the length, data, masked CRC of the data."""
  length = len(data).to_bytes(8, "little")
  return length + _masked_crc(length) + data + _masked_crc(data)


def _varint(value: int) -> bytes:
  """One protobuf varint (a field's tag or length)."""
  out = bytearray()
  while value >= 0x80:
    out.append(value & 0x7F | 0x80)
    value >>= 7
  out.append(value)
  return bytes(out)


def _varints(values: np.ndarray) -> bytes:
  """Protobuf varints of non-negative integers, vectorised."""
  v = np.asarray(values, np.uint64)
  n = np.ones(v.shape, np.int64)
  for k in range(1, 10):
    n += v >= np.uint64(1 << (7 * k))
  out = np.empty(int(n.sum()), np.uint8)
  starts = np.cumsum(n) - n
  for j in range(int(n.max(initial=1))):
    live = n > j
    byte = (v[live] >> np.uint64(7 * j)) & np.uint64(0x7F)
    out[starts[live] + j] = byte | np.where(n[live] > j + 1, 0x80, 0).astype(np.uint64)
  return out.tobytes()


def _field(number: int, payload: bytes) -> bytes:
  """A length-delimited protobuf field."""
  return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int64_feature(name: str, values: np.ndarray) -> bytes:
  # Features.feature map entry {key, value: Feature{int64_list: Int64List{packed value}}}.
  int64_list = _field(1, _varints(values)) if len(values) else b""
  return _field(1, _field(1, name.encode()) + _field(2, _field(3, int64_list)))


def encode_document(sentences: list[list[int]]) -> bytes:
  """A serialized tf.train.Example, encoded without TensorFlow (prepare never imports it)."""
  return _field(1, _token_features(sentences))


def _token_features(sentences: list[list[int]]) -> bytes:
  flat = np.fromiter((t for s in sentences for t in s), np.int64)
  lengths = np.array([len(s) for s in sentences], np.int64)
  return _int64_feature("token_ids", flat) + _int64_feature("sentence_lengths", lengths)


def encode_document_with_words(
    sentences: list[list[int]], word_lengths: list[int]
) -> tuple[bytes, bytes]:
  """(`encode_document(sentences)`, the same record with `word_lengths` too)."""
  tokens = _token_features(sentences)
  words = _int64_feature("word_lengths", np.asarray(word_lengths, np.int64))
  return _field(1, tokens), _field(1, tokens + words)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
  value = shift = 0
  while True:
    b = buf[pos]
    value |= (b & 0x7F) << shift
    pos, shift = pos + 1, shift + 7
    if b < 0x80:
      return value, pos


def _fields(buf: memoryview):
  """(field number, wire type, value) of one protobuf message; LEN values as memoryviews."""
  pos = 0
  while pos < len(buf):
    tag, pos = _read_varint(buf, pos)
    number, wire = tag >> 3, tag & 7
    if wire == 0:
      value, pos = _read_varint(buf, pos)
    elif wire == 2:
      n, pos = _read_varint(buf, pos)
      value, pos = buf[pos : pos + n], pos + n
    elif wire in (1, 5):
      n = 8 if wire == 1 else 4
      value, pos = bytes(buf[pos : pos + n]), pos + n
    else:
      raise errors.BadInputError(f"not a tf.train.Example: unsupported protobuf wire type {wire}")
    yield number, wire, value


def _decode_varints(buf: memoryview) -> np.ndarray:
  """Packed protobuf varints -> int64 array, vectorised."""
  b = np.frombuffer(buf, np.uint8)
  if not len(b):
    return np.zeros((0,), np.int64)
  ends = np.flatnonzero(b < 0x80)
  starts = np.concatenate([[0], ends[:-1] + 1])
  shift = (np.arange(len(b)) - np.repeat(starts, ends - starts + 1)) * 7
  parts = (b & 0x7F).astype(np.uint64) << shift.astype(np.uint64)
  return np.bitwise_or.reduceat(parts, starts).astype(np.int64)


def decode_document(payload: bytes, words: bool = False) -> list[np.ndarray]:
  """A serialized tf.train.Example of `encode_document` -> int32 sentence arrays. `words`:
  tokens that continue a segmented word come as ~id (segment.mark), when the record has
  word_lengths."""
  features = {}
  for number, _, features_msg in _fields(memoryview(payload)):
    if number != 1:
      continue
    for _, _, entry in _fields(features_msg):
      key, values = None, np.zeros((0,), np.int64)
      for n, _, v in _fields(entry):
        if n == 1:
          key = bytes(v).decode()
        elif n == 2:
          for kind, _, lst in _fields(v):
            if kind == 3:  # int64_list; packed or not
              chunks = [
                  _decode_varints(x) if w == 2 else np.array([x], np.int64)
                  for _, w, x in _fields(lst)
              ]
              values = np.concatenate(chunks) if chunks else values
      features[key] = values
  tokens = features["token_ids"].astype(np.int32)
  if words and "word_lengths" in features:
    from bertjax.data import segment

    tokens = segment.mark(tokens, segment.continuation_flags(features["word_lengths"], len(tokens)))
  return np.split(tokens, np.cumsum(features["sentence_lengths"])[:-1])


def read_records(path: str, start: int = 0) -> Iterator[bytes]:
  """Payloads of a TFRecord file from record `start` on (skipped records are not read). A local
  file is read without TensorFlow; `gs://` and other schemes through its file systems."""
  with fs.path(path).open("rb") as f:
    index = 0
    while True:
      header = f.read(12)
      if not header:
        return
      if len(header) < 12:
        raise errors.BadInputError(
            f"{path}: truncated record header after record {index}{_REPREPARE}"
        )
      n = int.from_bytes(header[:8], "little")
      if header[8:12] != _masked_crc(header[:8]):
        raise errors.BadInputError(f"{path}: corrupt length of record {index}{_REPREPARE}")
      if index < start:
        f.seek(n + 4, 1)
      else:
        data = f.read(n + 4)
        if len(data) < n + 4:
          raise errors.BadInputError(f"{path}: truncated record {index}{_REPREPARE}")
        yield data[:n]
      index += 1


def read_documents(path: str, start: int = 0, words: bool = False) -> Iterator[list[np.ndarray]]:
  """Documents of one shard from record `start` on, each a list of int32 sentence arrays.

  The plain-Python reader: the stream's reader without TensorFlow (or with
  `InputConfig.reader="python"`), and the reference that tf_reader.py is tested against.
  The data CRCs are not checked (tf.data checks them), the lengths are. `words`: as
  `decode_document`.
  """
  for payload in read_records(path, start):
    yield decode_document(payload, words)


def write_metadata(
    out_dir: str | os.PathLike, meta: dict, worker_index: int, num_workers: int
) -> epath.Path:
  path = fs.path(out_dir) / metadata_name(worker_index, num_workers)
  data = json.dumps(meta, indent=2, sort_keys=True) + "\n"
  if not fs.is_local(path):  # an object store publishes an object only once it is whole
    path.write_text(data)
    return path
  tmp = path.with_suffix(".tmp")
  tmp.write_text(data)
  tmp.replace(path)  # a crash never leaves a half-written metadata.json
  return path


def _merge(parts: list[dict]) -> dict:
  merged = dict(parts[0])
  for key in ("documents", "sentences", "tokens", "input_bytes"):
    merged[key] = sum(p.get(key, 0) for p in parts)
  for key in ("skipped", "repaired", "warnings"):
    total = collections.Counter()
    for p in parts:
      total.update(p.get(key, {}))
    merged[key] = dict(sorted(total.items()))
  merged["shards"] = [s for p in parts for s in p["shards"]]
  merged["examples_of_problems"] = [e for p in parts for e in p.get("examples_of_problems", [])]
  if len({p["tokenizer"]["sha256"] for p in parts}) > 1:
    names = [f"metadata-{p['worker_index']:05d}" for p in parts]
    raise errors.BadInputError(
        f"the workers' metadata ({', '.join(names)}) name different tokenizers — prepare "
        "every worker's part with the same tokenizer"
    )
  return merged


def _read_json(path: epath.Path, shown: epath.Path) -> dict:
  return schema.read_metadata(path, str(shown))  # one line naming the field on a mismatch


def load_metadata(data_dir: str | os.PathLike) -> dict:
  """metadata.json, or the merge of all workers' parts; clear errors when incomplete."""
  shown, data_dir = epath.Path(data_dir), fs.path(data_dir)  # as the user wrote it; to read
  single = data_dir / "metadata.json"
  if single.is_file():
    return _read_json(single, shown / single.name)
  parts = sorted(data_dir.glob("metadata-*-of-*.json"), key=str)
  if not parts:
    what = "no such directory" if not data_dir.is_dir() else "no metadata.json in it"
    raise errors.InputNotFoundError(
        f"{shown}: {what}, so not data prepared by `bertjax prepare` — prepare it with "
        f"`bertjax prepare --output {shown}`"
    )
  metas = [_read_json(p, shown / p.name) for p in parts]
  expected = metas[0]["num_workers"]
  have = sorted(m["worker_index"] for m in metas)
  if have != list(range(expected)):
    missing = sorted(set(range(expected)) - set(have))
    raise errors.InputNotFoundError(
        f"{shown}: metadata of workers {missing} of {expected} is "
        "missing; run `bertjax prepare --worker-index K` for them"
    )
  return schema.check_metadata(_merge(metas), str(shown))


def special_ids(meta: dict) -> dict[str, int]:
  """{pad, unk, cls, sep, mask} ids of the tokenizer the data was prepared with.

  Recorded by `prepare` (WordPiece: [PAD]=0 [UNK]=100 [CLS]=101 [SEP]=102 [MASK]=103 in
  BERT's vocabs), so the stream knows them without loading the tokenizer; data prepared
  before they were recorded used the SentencePiece constants.
  """
  default = {
      "pad": tokenizer_lib.PAD_ID,
      "unk": tokenizer_lib.UNK_ID,
      "cls": tokenizer_lib.CLS_ID,
      "sep": tokenizer_lib.SEP_ID,
      "mask": tokenizer_lib.MASK_ID,
  }
  return {**default, **meta["tokenizer"].get("special_ids", {})}


def check_shards(meta: dict, data_dir: str | os.PathLike) -> None:
  """Every shard metadata.json lists is there, with its recorded size in a local directory
  (data prepared before sizes were recorded is checked for presence only). An object store is
  listed once; its sizes are not checked (an upload is published whole or not at all)."""
  shown, directory = epath.Path(data_dir), fs.path(data_dir)
  listed = None if fs.is_local(directory) else {p.name for p in directory.iterdir()}
  for s in meta["shards"]:
    if not s.get("documents"):
      continue
    path = directory / s["file"]
    if not (path.is_file() if listed is None else s["file"] in listed):
      raise errors.InputNotFoundError(
          f"{shown / s['file']}: missing, but {shown}/metadata.json lists it "
          "(an incomplete copy?); copy it again, or re-prepare with "
          "`bertjax prepare ... --overwrite`"
      )
    if listed is None and "bytes" in s and (size := corpus.file_size(path)) != s["bytes"]:
      raise errors.BadInputError(
          f"{shown / s['file']}: {size:,} bytes, but metadata.json records "
          f"{s['bytes']:,} (truncated or replaced); copy it again, or "
          "re-prepare with `bertjax prepare ... --overwrite`"
      )


def split_shards(meta: dict, data_dir: str | os.PathLike, split: str) -> list[dict]:
  """The shards of one split, sorted by name, each with its absolute `path`."""
  if split not in SPLITS:
    raise errors.ConfigError(f"split {split!r}: valid options are {SPLITS}")
  shards = sorted(
      (s for s in meta["shards"] if s["split"] == split and s["documents"] > 0),
      key=lambda s: s["file"],
  )
  for s in shards:
    s["path"] = str(fs.path(data_dir) / s["file"])  # a string, as tf.data takes it
  return shards
