"""The prepared-data format: TFRecord shards of tokenized documents plus `metadata.json`.

One record = one document, a `tf.train.Example` with two int64 lists:
    token_ids         the document's tokens, all sentences concatenated
    sentence_lengths  tokens per sentence (sums to len(token_ids))
Shards are `train-00003-of-00016.tfrecord` and `eval-00000-of-00001.tfrecord`. With
`prepare --num-workers W`, worker k writes its own shards (global index k*N + i of W*N) and
`metadata-0000k-of-0000W.json`; `load_metadata` merges them, so hosts can prepare in parallel.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import pathlib
from typing import Iterator

import numpy as np

FORMAT_VERSION = 1
SPLITS = ("train", "eval")
_DECODE_BATCH = 64  # documents parsed per tf.io.parse_example call


def shard_name(split: str, index: int, total: int) -> str:
    return f"{split}-{index:05d}-of-{total:05d}.tfrecord"


def metadata_name(worker_index: int, num_workers: int) -> str:
    if num_workers == 1:
        return "metadata.json"
    return f"metadata-{worker_index:05d}-of-{num_workers:05d}.json"


def encode_document(sentences: list[list[int]]) -> bytes:
    import tensorflow as tf

    flat = [t for s in sentences for t in s]
    feature = {
        "token_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=flat)),
        "sentence_lengths": tf.train.Feature(
            int64_list=tf.train.Int64List(value=[len(s) for s in sentences])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def read_documents(path: str, start: int = 0) -> Iterator[list[np.ndarray]]:
    """Documents of one shard from record `start` on, each a list of int32 sentence arrays."""
    import tensorflow as tf

    spec = {"token_ids": tf.io.RaggedFeature(tf.int64),
            "sentence_lengths": tf.io.RaggedFeature(tf.int64)}

    def parse(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        return {"tokens": tf.cast(parsed["token_ids"].flat_values, tf.int32),
                "doc_lengths": parsed["token_ids"].row_lengths(),
                "sentence_lengths": parsed["sentence_lengths"].flat_values,
                "doc_sentences": parsed["sentence_lengths"].row_lengths()}

    ds = (tf.data.TFRecordDataset(path, buffer_size=1 << 22).skip(start)
          .batch(_DECODE_BATCH).map(parse).prefetch(2))
    for batch in ds.as_numpy_iterator():
        token_ends = np.cumsum(batch["doc_lengths"])
        sentence_ends = np.cumsum(batch["doc_sentences"])
        for i in range(len(token_ends)):
            doc = batch["tokens"][token_ends[i] - batch["doc_lengths"][i]:token_ends[i]]
            lens = batch["sentence_lengths"][
                sentence_ends[i] - batch["doc_sentences"][i]:sentence_ends[i]]
            yield np.split(doc, np.cumsum(lens)[:-1])


def write_metadata(out_dir: str | os.PathLike, meta: dict, worker_index: int,
                   num_workers: int) -> pathlib.Path:
    path = pathlib.Path(out_dir) / metadata_name(worker_index, num_workers)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)  # a crash never leaves a half-written metadata.json
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
        raise ValueError("metadata parts were prepared with different tokenizers")
    return merged


def load_metadata(data_dir: str | os.PathLike) -> dict:
    """metadata.json, or the merge of all workers' parts; clear errors when incomplete."""
    data_dir = pathlib.Path(data_dir)
    single = data_dir / "metadata.json"
    if single.is_file():
        return json.loads(single.read_text())
    parts = sorted(glob.glob(str(data_dir / "metadata-*-of-*.json")))
    if not parts:
        raise FileNotFoundError(f"{data_dir}: no metadata.json; prepare the data with "
                                "`bertjax prepare --output DIR`")
    metas = [json.loads(pathlib.Path(p).read_text()) for p in parts]
    expected = metas[0]["num_workers"]
    have = sorted(m["worker_index"] for m in metas)
    if have != list(range(expected)):
        missing = sorted(set(range(expected)) - set(have))
        raise FileNotFoundError(f"{data_dir}: metadata of workers {missing} of {expected} is "
                                "missing; run `bertjax prepare --worker-index K` for them")
    return _merge(metas)


def split_shards(meta: dict, data_dir: str | os.PathLike, split: str) -> list[dict]:
    """The shards of one split, sorted by name, each with its absolute `path`."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: valid options are {SPLITS}")
    shards = sorted((s for s in meta["shards"] if s["split"] == split and s["documents"] > 0),
                    key=lambda s: s["file"])
    for s in shards:
        s["path"] = str(pathlib.Path(data_dir) / s["file"])
    return shards
