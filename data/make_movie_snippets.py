"""Regenerates `data/movie_snippets/{train,dev,test}.tsv`, the bundled downstream task, from PyPI.

Source: the sdist of `vaderSentiment` 3.3.2 on PyPI (MIT licence, C.J. Hutto), which ships the
data set of Hutto & Gilbert (ICWSM 2014) as `additional_resources/hutto_ICWSM_2014.tar.gz`. Its
`movieReviewSnippets_GroundTruth.txt` holds 10,605 sentence-level movie-review snippets (Rotten
Tomatoes, via Pang & Lee's sentence polarity data) with the mean of at least 20 human ratings
each, on a scale from -4 (extremely negative) to +4 (extremely positive).

The task is binary sentiment in SST-2's layout (`sentence<TAB>label`, label 1 = positive):
snippets whose mean rating is >= +1.0 are positive, <= -1.0 negative, the weak/neutral band
in between is dropped. Texts are whitespace-normalised and deduplicated (case-insensitive; a
text seen with both labels is dropped), 3,000 per class are kept, and each class is split
80/10/10 into train/dev/test by a seeded hash of the text, so the split is stratified, no text
is in two splits, and the output is the same byte for byte on every machine and Python.
Needs only the standard library (the wheel lacks the data: use the sdist).

    d="$(mktemp -d)" && pip download --no-binary :all: --no-deps vaderSentiment==3.3.2 -d "$d"
    python data/make_movie_snippets.py --sdist "$d"/vaderSentiment-3.3.2.tar.gz
"""

from __future__ import annotations

import argparse
import hashlib
import io
import pathlib
import tarfile

SDIST_MEMBER = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
DATA_MEMBER = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
DATA_SHA256 = "c8293b0d942e90e223ea2c0955d969040d1a1be514a978b9af0698940bd13350"
THRESHOLD = 1.0  # |mean rating| below this is too weak to call either way
PER_CLASS = 3000
SPLITS = (("train", 0.8), ("dev", 0.1), ("test", 0.1))
SEED = "bertjax-movie-snippets-v1"
HEADER = "sentence\tlabel\n"


def read_snippets(sdist: pathlib.Path) -> bytes:
  """The raw ground-truth file, from the inner tarball of the sdist (no extraction)."""
  with tarfile.open(sdist) as outer:
    inner = outer.extractfile(SDIST_MEMBER).read()
  with tarfile.open(fileobj=io.BytesIO(inner)) as tar:
    raw = tar.extractfile(DATA_MEMBER).read()
  digest = hashlib.sha256(raw).hexdigest()
  if digest != DATA_SHA256:
    raise SystemExit(
        f"{DATA_MEMBER}: sha256 {digest}, expected {DATA_SHA256} "
        "(not vaderSentiment 3.3.2's data?)"
    )
  return raw


def labelled(raw: bytes) -> list[tuple[str, str]]:
  """(text, label) for every snippet outside the neutral band, deduplicated, in file order."""
  rows, seen, conflicting = [], {}, set()
  for line in raw.decode("utf-8").splitlines():
    if not line.strip():
      continue
    _id, rating, text = line.split("\t")
    text = " ".join(text.split())  # no tabs, CRs or runs of spaces left
    score = float(rating)
    if not text or abs(score) < THRESHOLD:
      continue
    label = "1" if score > 0 else "0"
    key = text.lower()
    if key in seen:
      if seen[key] != label:
        conflicting.add(key)
      continue
    seen[key] = label
    rows.append((text, label))
  return [(t, l) for t, l in rows if t.lower() not in conflicting]


def _order(text: str) -> str:
  return hashlib.sha256(f"{SEED}\t{text.lower()}".encode("utf-8")).hexdigest()


def split(rows: list[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
  out = {name: [] for name, _ in SPLITS}
  for label in ("0", "1"):
    chosen = sorted((r for r in rows if r[1] == label), key=lambda r: _order(r[0]))
    if len(chosen) < PER_CLASS:
      raise SystemExit(f"only {len(chosen)} snippets with label {label}")
    chosen, start = chosen[:PER_CLASS], 0
    for name, frac in SPLITS:
      n = round(frac * PER_CLASS)
      out[name].extend(chosen[start : start + n])
      start += n
  return {name: sorted(r, key=lambda r: _order(r[0])) for name, r in out.items()}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument(
      "--sdist",
      type=pathlib.Path,
      required=True,
      help="vaderSentiment-3.3.2.tar.gz, from `pip download --no-binary :all:`",
  )
  parser.add_argument(
      "--output-dir", type=pathlib.Path, default=pathlib.Path("data/movie_snippets")
  )
  args = parser.parse_args()
  rows = labelled(read_snippets(args.sdist))
  args.output_dir.mkdir(parents=True, exist_ok=True)
  for name, split_rows in split(rows).items():
    path = args.output_dir / f"{name}.tsv"
    with open(path, "w", encoding="utf-8", newline="\n") as f:
      f.write(HEADER)
      f.writelines(f"{text}\t{label}\n" for text, label in split_rows)
    pos = sum(l == "1" for _, l in split_rows)
    print(
        f"wrote {path}: {len(split_rows)} rows ({pos} positive), "
        f"{path.stat().st_size / 1e3:.0f} kB"
    )


if __name__ == "__main__":
  main()
