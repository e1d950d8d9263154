"""Fine-tune a pretrained encoder for token classification (NER) and score entity F1.

    run = train.train_and_evaluate(enc, splits, recipe, max_seq_len=128, workdir="out/ner")

NER's adapter (`NerTask`) for the fine-tuning runner (`bertjax.tasks.finetuning.run`).
`splits` holds "train", "dev" and optionally "test" (`conll.Sentences`). The loss is the
cross-entropy of each word's first piece. After each epoch the dev words are tagged and scored
with `metrics.score` (entity-level micro F1); the best epoch tags dev and test, writing
workdir/{dev,test}_predictions.txt (TOKEN GOLD PREDICTED) and workdir/results.json; its
parameters go to workdir/best/ (orbax) with best.json (labels included).

Shape letters: B batch, L sequence length, C tag classes.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax import model as model_lib
from bertjax.data.tokenizer import Tokenizer
from bertjax.runtime import fs
from bertjax.tasks import finetuning
from bertjax.tasks.encoder import Encoder
from bertjax.tasks.finetuning import Finished, Splits, Trainer
from bertjax.tasks.recipe import Recipe
from bertjax.tasks.ner import conll, features as feats_lib, metrics


def ner_loss(logits_BxLxC, batch: dict) -> jax.Array:
  """The mean cross-entropy over the scored pieces (label >= 0) of the batch's rows (weight
  1), or of its packed rows, whose empty slots hold no labels."""
  labels_BxL = batch["labels"]
  scored_BxL = (labels_BxL >= 0).astype(jnp.float32)
  if "segment_ids" not in batch:  # a row of weight 0 pads the last batch
    scored_BxL = scored_BxL * batch["weights"][:, None]
  ce_BxL = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxC, jnp.maximum(labels_BxL, 0))
  return jnp.sum(ce_BxL * scored_BxL) / jnp.maximum(jnp.sum(scored_BxL), 1.0)


def make_model(num_labels: int, packing: int = 0):
  """The tagging head, packed rows or not (`packing`): it takes segment ids."""
  del packing
  return functools.partial(model_lib.BertForTokenClassification, num_labels=num_labels)


def tag(
    trainer: Trainer,
    params,
    sents: conll.Sentences,
    feats: feats_lib.Features,
    labels: list[str],
    batch_size: int,
) -> list[list[str]]:
  logits_NxLxC = trainer.predict(params, feats.arrays, batch_size)
  return feats_lib.word_tags(feats, sents, np.argmax(logits_NxLxC, -1), labels)


@dataclasses.dataclass
class NerTask:
  """Token classification as a `finetuning` adapter: trained on `splits["train"]`, dev scored
  after each epoch, dev and test tagged with the best."""

  tok: Tokenizer
  splits: dict[str, conll.Sentences]
  max_seq_len: int
  name = "ner"
  run_name = ""
  main_metric = "f1"

  @functools.cached_property
  def labels(self) -> list[str]:
    """The tags of the training file, the model's classes in this order."""
    return conll.label_list(self.splits["train"])

  @functools.cached_property
  def rows(self) -> dict[str, feats_lib.Features]:
    """Every split's rows, built once."""
    labels, splits = self.labels, self.splits
    unseen = sorted(set(conll.label_list(*splits.values())) - set(labels))
    if unseen:
      print(
          f"ner: tags {', '.join(unseen)} are not in the training file; they are scored but "
          "never predicted",
          flush=True,
      )
    feats = {k: feats_lib.build(self.tok, v, labels, self.max_seq_len) for k, v in splits.items()}
    print(
        "ner: "
        + ", ".join(f"{k} {len(splits[k])} sentences -> {len(f)} rows" for k, f in feats.items())
        + f"; {len(labels)} tags",
        flush=True,
    )
    return feats

  def features(self) -> Splits:
    rows = self.rows
    return Splits(
        train=rows["train"].arrays,
        scored={"dev": rows["dev"].arrays},
        final={s: rows[s].arrays for s in ("dev", "test") if s in self.splits},
    )

  def head(self, cfg: model_lib.BertConfig) -> model_lib.BertForTokenClassification:
    return model_lib.BertForTokenClassification(cfg, num_labels=len(self.labels))

  def loss(self, logits_BxLxC: jax.Array, batch: dict) -> jax.Array:
    return ner_loss(logits_BxLxC, batch)

  def predictions(self, split: str, logits_NxLxC: np.ndarray) -> list[list[str]]:
    """Each word's tag: its first piece's."""
    pieces_NxL = np.argmax(logits_NxLxC, -1)
    return feats_lib.word_tags(self.rows[split], self.splits[split], pieces_NxL, self.labels)

  def metric(self, predicted: dict[str, list[list[str]]]) -> dict[str, float]:
    return metrics.score(self.splits["dev"].tags, predicted["dev"])

  def submission(self, predicted: dict[str, list[list[str]]], run: Finished) -> dict:
    """{dev,test}_predictions.txt (TOKEN GOLD PREDICTED) and results.json."""
    result = run.fit
    out = dict(
        best_epoch=result.best_epoch, dev=result.best, labels=self.labels, history=result.history
    )
    untrained = [h for h in result.history if h["epoch"] == 0]
    out["untrained"] = untrained[0] if untrained else None
    if "test" in predicted:
      out["test"] = metrics.score(self.splits["test"].tags, predicted["test"])
    if jax.process_index() == 0:
      for split, tags in predicted.items():
        path = fs.path(run.workdir) / f"{split}_predictions.txt"
        conll.write_predictions(path, self.splits[split], tags)
      (fs.path(run.workdir) / "results.json").write_text(json.dumps(out, indent=2))
    return dict(
        task="ner",
        labels=self.labels,
        init=run.encoder.source,
        dev=result.best,
        config=run.config.to_dict(),
        recipe=dataclasses.asdict(run.recipe),
        max_seq_len=self.max_seq_len,
        packing=run.packing,
        tokenizer=str(self.tok.path),
    )


def train_and_evaluate(
    enc: Encoder,
    splits: dict[str, conll.Sentences],
    recipe: Recipe,
    max_seq_len: int,
    workdir: str,
    eval_untrained: bool = False,
    progress: bool = True,
    packing: int = 0,
) -> finetuning.FitResult:
  """Fine-tune on `splits["train"]`, score dev after each epoch, tag dev and test with the
  best epoch. `packing` > 0 packs up to that many rows (sentences) into a row of
  `max_seq_len` to train and predict (`finetuning.Trainer`), each tagged from its own tokens;
  0 one a row."""
  return finetuning.run(
      NerTask(enc.tokenizer, splits, max_seq_len),
      enc,
      recipe,
      workdir,
      packing=packing,
      eval_untrained=eval_untrained,
      progress=progress,
  ).fit
