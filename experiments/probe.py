r"""Linear probes on frozen features: what a checkpoint's encoder already knows about a task.

Purpose: the second measurement behind "why does the checkpoint not transfer?" (the first is
`experiments.domain_check`). Fine-tuning reads the task through one vector, the pooler's tanh
of the last layer's [CLS] state. If pretraining left that vector nearly the same for every
sentence, the classifier starts from nothing even when the token states below it carry the
task. For the pretrained checkpoint and for the same architecture at random init (several
seeds), this script extracts, with no training of the encoder:
  * the [CLS] state and the mean of the token states at every layer (embeddings, 0 .. -1),
  * the pooled output (what `bertjax glue`'s classifier reads),
fits a logistic regression on each (standardised features, L2 picked on a held-out slice of
train), and reports dev accuracy beside how much the vector varies across sentences (mean
cosine similarity of two different sentences' vectors: 1.0 means the same vector for all).

Command (after `make demo`, on the bundled task data/movie_snippets):
  python -m experiments.probe --init runs/demo --out runs/probe

Writes OUT/results.json and OUT/results.md. Hardware: about a minute on one CPU core for the
tiny model and 3 random-init seeds.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import locations
from bertjax import model as model_lib
from bertjax.tasks import encoder as encoder_lib
from experiments import bow_baseline

_TASK = locations.DATA_DIR / "movie_snippets"
L2_GRID = (1e-4, 1e-3, 1e-2, 1e-1)


def encode(tok, texts: list[str], max_seq_len: int) -> tuple[np.ndarray, np.ndarray]:
  """[CLS] text [SEP] ids and masks, [N, max_seq_len]."""
  ids = np.zeros((len(texts), max_seq_len), np.int32)
  for r, t in enumerate(texts):
    row = [tok.cls_id] + tok.encode(t)[: max_seq_len - 2] + [tok.sep_id]
    ids[r, : len(row)] = row
  return ids, (ids != 0).astype(np.int32)


def features(cfg, params, ids: np.ndarray, mask: np.ndarray, batch: int = 200) -> dict:
  """name -> [N, H] float64: cls@layer, mean@layer for every layer, and pooled."""
  model = model_lib.BertModel(cfg.replace(scan_layers=False))

  @jax.jit
  def fn(params, ids, mask):
    out = model.apply(
        {"params": params}, ids, None, mask, deterministic=True, output_hidden_states=True
    )
    m = mask[:, :, None].astype(jnp.float32)
    res = {"pooled": out.pooled_output}
    for i, h in enumerate(out.hidden_states):
      name = "embeddings" if i == 0 else f"layer{i - 1}"
      res[f"cls@{name}"] = h[:, 0]
      res[f"mean@{name}"] = (h * m).sum(1) / m.sum(1)
    return res

  parts = [
      jax.device_get(fn(params, ids[s : s + batch], mask[s : s + batch]))
      for s in range(0, len(ids), batch)
  ]
  return {k: np.concatenate([p[k] for p in parts]).astype(np.float64) for k in parts[0]}


def mean_cosine(x: np.ndarray, pairs: int = 2000, seed: int = 0) -> float:
  """Mean cosine similarity of the vectors of two different rows (random pairs)."""
  rng = np.random.default_rng(seed)
  a, b = rng.integers(0, len(x), pairs), rng.integers(0, len(x), pairs)
  keep = a != b
  xa, xb = x[a[keep]], x[b[keep]]
  den = np.linalg.norm(xa, axis=1) * np.linalg.norm(xb, axis=1)
  return float(np.mean((xa * xb).sum(1) / np.maximum(den, 1e-12)))


def fit_logistic(x, y, l2, steps=300, lr=0.1):
  """Binary/multiclass softmax regression, full-batch Adam on standardised x; (W, b)."""
  k = int(y.max()) + 1
  w, b = np.zeros((x.shape[1], k)), np.zeros(k)
  m = [np.zeros_like(w), np.zeros_like(b)]
  v = [np.zeros_like(w), np.zeros_like(b)]
  onehot = np.eye(k)[y]
  for t in range(1, steps + 1):
    p = bow_baseline._softmax(x @ w + b)
    g = [x.T @ (p - onehot) / len(x) + l2 * w, (p - onehot).mean(0)]
    for i, (param, grad) in enumerate(zip((w, b), g)):
      m[i] = 0.9 * m[i] + 0.1 * grad
      v[i] = 0.999 * v[i] + 0.001 * grad**2
      param -= lr * (m[i] / (1 - 0.9**t)) / (np.sqrt(v[i] / (1 - 0.999**t)) + 1e-8)
  return w, b


def probe(x_tr, y_tr, x_dev, y_dev, seed: int = 0) -> tuple[float, float]:
  """(dev accuracy, chosen L2): standardise on train, L2 picked on 10% of train."""
  mu, sd = x_tr.mean(0), x_tr.std(0) + 1e-6
  x_tr, x_dev = (x_tr - mu) / sd, (x_dev - mu) / sd
  idx = np.random.default_rng(seed).permutation(len(x_tr))
  hold, fit = idx[: len(idx) // 10], idx[len(idx) // 10 :]
  scores = []
  for l2 in L2_GRID:
    w, b = fit_logistic(x_tr[fit], y_tr[fit], l2)
    scores.append(np.mean((x_tr[hold] @ w + b).argmax(1) == y_tr[hold]))
  l2 = L2_GRID[int(np.argmax(scores))]
  w, b = fit_logistic(x_tr, y_tr, l2)
  return float(np.mean((x_dev @ w + b).argmax(1) == y_dev)), l2


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  p.add_argument("--init", required=True, help="the pretrained checkpoint (a pretrain workdir)")
  p.add_argument("--task", type=pathlib.Path, default=_TASK, help="dir with train.tsv, dev.tsv")
  p.add_argument("--text-column", default="sentence")
  p.add_argument("--label-column", default="label")
  p.add_argument("--random-seeds", type=int, default=3, help="random-init encoders 0..N-1")
  p.add_argument("--max-seq-len", type=int, default=128)
  p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/probe"))
  args = p.parse_args(argv)

  data = {
      split: bow_baseline.load(str(args.task / f"{split}.tsv"), args.text_column, args.label_column)
      for split in ("train", "dev")
  }
  labels = sorted(set(data["train"][1]))
  y = {s: np.array([labels.index(l) for l in data[s][1]]) for s in data}
  enc = encoder_lib.load_encoder(args.init, prefix="probe")
  ids = {s: encode(enc.tokenizer, list(data[s][0]), args.max_seq_len) for s in data}
  encoders = {"pretrained": enc.bert_params}
  cfg = enc.config.replace(scan_layers=False)
  for seed in range(args.random_seeds):
    init = model_lib.BertModel(cfg).init(
        jax.random.key(seed), jnp.zeros((1, 8), jnp.int32), None, jnp.ones((1, 8), jnp.int32)
    )
    encoders[f"random{seed}"] = init["params"]

  rows = {}
  for name, params in encoders.items():
    f = {s: features(cfg, params, *ids[s]) for s in data}
    for feat in f["train"]:
      acc, l2 = probe(f["train"][feat], y["train"], f["dev"][feat], y["dev"])
      rows.setdefault(feat, {})[name] = dict(
          dev_accuracy=acc, l2=l2, mean_cosine=mean_cosine(f["dev"][feat])
      )
    print(f"probe: {name} done", flush=True)
  args.out.mkdir(parents=True, exist_ok=True)
  result = dict(task=str(args.task), init=args.init, rows=rows)
  (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
  rand = [n for n in encoders if n != "pretrained"]
  md = [
      "| features | pretrained: dev acc (cosine) | random init: dev acc mean ± std "
      f"({len(rand)} seeds) (cosine) |",
      "|---|---|---|",
  ]
  for feat, r in rows.items():
    accs = np.array([r[n]["dev_accuracy"] for n in rand])
    cos = np.mean([r[n]["mean_cosine"] for n in rand])
    pre = r["pretrained"]
    md.append(
        f"| {feat} | {pre['dev_accuracy']:.3f} ({pre['mean_cosine']:.2f}) | "
        f"{accs.mean():.3f} ± {accs.std(ddof=1) if len(accs) > 1 else 0:.3f} ({cos:.2f}) |"
    )
  (args.out / "results.md").write_text("\n".join(md) + "\n")
  print("\n".join(md))
  print(f"probe: wrote {args.out / 'results.json'} and results.md")
  return 0


if __name__ == "__main__":
  sys.exit(main())
