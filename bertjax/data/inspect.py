"""What the model will see: decoded examples (`data preview`) and stream statistics (`data stats`).

Both read packed streams too: preview prints each row's examples with where they sit in the
row, stats counts examples (not rows) and reports how full the rows are.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax.data import mixture, packing, pretraining, records, wordpiece
from bertjax.data.tokenizer import WORD_START
from bertjax.runtime import fs


def _tokenizer(data_dir: str):
  """The data's own tokenizer: SentencePiece `Tokenizer` or `wordpiece.WordPieceTokenizer`."""
  meta = records.load_metadata(data_dir)
  return wordpiece.load_tokenizer(fs.path(data_dir) / meta["tokenizer"]["file"])


def _render(tok, ids: np.ndarray) -> str:
  """Pieces joined as text; special tokens stay visible, e.g. "[MASK]"."""
  special = {tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id}
  wordpiece_vocab = isinstance(tok, wordpiece.WordPieceTokenizer)
  out = []
  for i in ids:
    piece = tok.id_to_piece(int(i))
    if wordpiece_vocab:  # "##ing" continues a word; every other piece starts one
      piece = piece[2:] if piece.startswith(wordpiece.SUFFIX) else " " + piece
    elif piece.startswith(WORD_START):
      piece = " " + piece[1:]
    elif int(i) in special:
      piece = " " + piece
    out.append(piece)
  return "".join(out).strip()


def describe(tok, batch: dict[str, np.ndarray], row: int, pair_mode: str, offset: int = 0) -> str:
  """One example (an unpacked row) as text: segments, masked tokens with their originals,
  label; masked positions are shown plus `offset` (the example's place in a packed row)."""
  n = int(batch["attention_mask"][row].sum())
  ids, types = batch["input_ids"][row][:n], batch["token_type_ids"][row][:n]
  seps = np.flatnonzero(ids == tok.sep_id)
  a_end = seps[0] if len(seps) else n
  lines = [f"segment A: {_render(tok, ids[1:a_end])}"]
  if types.any():
    lines.append(f"segment B: {_render(tok, ids[a_end + 1:n - 1])}")
  shown = []
  for pos, orig, w in zip(
      batch["masked_positions"][row], batch["masked_ids"][row], batch["masked_weights"][row]
  ):
    if w:
      now = tok.id_to_piece(int(ids[pos]))
      shown.append(f"{pos + offset}:{now}<-{tok.id_to_piece(int(orig))}")
  lines.append(f"masked ({len(shown)}): " + " ".join(shown))
  label = int(batch["nsp_labels"][row])
  names = {"nsp": ("IsNext", "NotNext"), "sop": ("InOrder", "Swapped"), "none": ("-", "-")}
  lines.append(f"label: {label} ({names[pair_mode][label]}), length {n}")
  return "\n".join(lines)


def preview(cfg: pretraining.InputConfig, n: int, split: str = "train") -> str:
  """The first `n` rows of the stream as text (packed: every example of each row)."""
  tok = _tokenizer(cfg.sources[0][1] if cfg.sources else cfg.path)
  stream = pretraining.make_stream(
      cfg, global_batch_size=n, process_index=0, process_count=1, split=split
  )
  batch = next(stream)
  if not cfg.packing:
    return "\n\n".join(f"example {r}\n" + describe(tok, batch, r, cfg.pair_mode) for r in range(n))
  rows = []
  for r, examples in enumerate(packing.unpack(batch, cfg.max_predictions_per_seq, tok.pad_id)):
    real = int(batch["attention_mask"][r].sum())
    lines = [f"row {r}: {len(examples)} examples, {real}/{cfg.seq_len} real tokens"]
    for j, e in enumerate(examples):
      start, end = e["offset"], e["offset"] + int(e["attention_mask"].sum())
      one = {k: np.asarray(v)[None] for k, v in e.items() if k != "offset"}
      text = describe(tok, one, 0, cfg.pair_mode, offset=start)
      lines.append(f"example {r}.{j}: positions {start}..{end - 1}")
      lines.extend("  " + line for line in text.split("\n"))
    rows.append("\n".join(lines))
  return "\n\n".join(rows)


def _masked_runs(positions: np.ndarray, weights: np.ndarray, seq_len: int) -> int:
  """Runs of consecutive masked positions in these rows (a run never crosses a row)."""
  masked = np.zeros((len(positions), seq_len + 1), bool)
  rows = np.broadcast_to(np.arange(len(positions))[:, None], positions.shape)
  masked[rows[weights], positions[weights]] = True
  return int((masked[:, 1:] & ~masked[:, :-1]).sum() + masked[:, 0].sum())


def _two_segment_examples(b: dict[str, np.ndarray]) -> int:
  """Examples with a segment B (token type 1 somewhere), whether or not rows are packed."""
  if "segment_ids" not in b:
    return int(b["token_type_ids"].any(axis=1).sum())
  B, L = b["segment_ids"].shape
  example_BxL = np.arange(B)[:, None] * (L + 1) + b["segment_ids"]
  return len(np.unique(example_BxL[b["token_type_ids"] == 1]))


def stats(
    cfg: pretraining.InputConfig, n: int, batch_size: int = 256, split: str = "train"
) -> dict:
  """Masking and label statistics over the first `n` examples of the stream (packed: whole
  rows until `n` examples are in), and `real_token_fraction`, real tokens over row slots.
  Packed with `max_examples_per_row` 0, the E measured on the corpus is reported."""
  if cfg.packing:
    cfg = dataclasses.replace(cfg, max_examples_per_row=pretraining.examples_per_row(cfg))
  stream = pretraining.make_stream(
      cfg, global_batch_size=batch_size, process_index=0, process_count=1, split=split
  )
  first = cfg.sources[0][1] if cfg.sources else cfg.path  # a mixture: one tokenizer for all
  meta = records.load_metadata(first)
  ids_of = records.special_ids(meta)
  by_source = np.zeros(len(cfg.sources))
  pad_id, cls_id, sep_id, mask_id = (ids_of[k] for k in ("pad", "cls", "sep", "mask"))
  names = (
      "rows examples filled real masked spans mask_token random unchanged positive length "
      "segment_b"
  )
  c = dict.fromkeys(names.split(), 0)
  while c["examples"] < n:
    batch = next(stream)
    present = batch.get("nsp_weights", np.ones((batch_size, 1), np.int32)).astype(bool)
    # Whole rows, up to the one holding the n-th example.
    take = int(np.searchsorted(np.cumsum(present.sum(1)), n - c["examples"])) + 1
    b = {k: v[:take] for k, v in batch.items()}
    present = present[:take]
    ids, w = b["input_ids"], b["masked_weights"].astype(bool)
    now = np.take_along_axis(ids, b["masked_positions"], axis=1)[w]
    orig = b["masked_ids"][w]
    # Real non-special tokens: masked ones count by their original, which is never special.
    special = (ids == pad_id) | (ids == cls_id) | (ids == sep_id)
    c["rows"] += len(ids)
    # Rows are all seq_len long, so the batches' fractions weighted by rows give the whole's.
    c["filled"] += packing.real_token_fraction(b["attention_mask"]) * len(ids)
    c["real"] += int((~special).sum())
    c["masked"] += int(w.sum())
    c["spans"] += _masked_runs(b["masked_positions"], w, ids.shape[1])
    c["mask_token"] += int((now == mask_id).sum())
    c["unchanged"] += int((now == orig).sum())
    c["random"] += int(((now != mask_id) & (now != orig)).sum())
    c["positive"] += int(((b["nsp_labels"].reshape(present.shape) == 0) & present).sum())
    c["length"] += int(b["attention_mask"].sum())
    c["segment_b"] += _two_segment_examples(b)
    c["examples"] += int(present.sum())
    if cfg.sources:
      by_source += b["attention_mask"].sum(1) @ b[mixture.SOURCE_FEATURE]
  m, e = max(1, c["masked"]), max(1, c["examples"])
  return {
      "examples": c["examples"],
      "seq_len": cfg.seq_len,
      "pair_mode": cfg.pair_mode,
      "whole_word_mask": cfg.whole_word_mask,
      "word_segmenter": (meta.get("word_segmenter") or {}).get("name"),
      "masked_fraction": c["masked"] / max(1, c["real"]),
      "mask_token_fraction": c["mask_token"] / m,
      "random_token_fraction": c["random"] / m,
      "unchanged_fraction": c["unchanged"] / m,
      "nsp_positive_fraction": c["positive"] / e,
      "mean_real_length": c["length"] / e,
      "mean_masked_per_example": c["masked"] / e,
      # Masked tokens per run of consecutive masked positions: the words whole-word masking
      # masks (two masked words side by side make one run, so character masking gives a
      # little over 1).
      "mean_masked_span_length": c["masked"] / max(1, c["spans"]),
      "two_segment_fraction": c["segment_b"] / e,
      "packing": cfg.packing,
      **({"max_examples_per_row": cfg.max_examples_per_row} if cfg.packing else {}),
      "rows": c["rows"],
      "examples_per_row": c["examples"] / max(1, c["rows"]),
      "real_token_fraction": c["filled"] / max(1, c["rows"]),
      **({"mixture": _mixture(cfg, by_source)} if cfg.sources else {}),
  }


def _mixture(cfg: pretraining.InputConfig, by_source: np.ndarray) -> dict:
  """Each source's requested and realised share of the real tokens measured, and after how
  many training tokens it has been read once at its weight (then it repeats: mixture.py)."""
  out = {}
  for (name, path, weight), n in zip(cfg.sources, by_source):
    own = mixture.train_tokens(path)
    out[name] = {
        "requested": round(weight, 6),
        "realised": round(float(n / max(1.0, by_source.sum())), 6),
        "tokens": int(n),
        "train_tokens": own,
        "epoch_after_tokens": int(own / weight) if weight > 0 else None,
    }
  return out
