"""Fine-tune a pretrained encoder for token classification (NER) and score entity F1.

    run = train.train_and_evaluate(enc, splits, recipe, max_seq_len=128, workdir="out/ner")

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
from bertjax.runtime import fs
from bertjax.tasks import finetuning
from bertjax.tasks.encoder import Encoder
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
  """The tagging head; on packed rows (`packing` > 0) the same head and parameters, taking
  segment ids."""
  if packing:
    return functools.partial(
        finetuning.PackedTokenHead, num_outputs=num_labels, head="classifier", dropout=True
    )
  return functools.partial(model_lib.BertForTokenClassification, num_labels=num_labels)


def tag(
    trainer: finetuning.Trainer,
    params,
    sents: conll.Sentences,
    feats: feats_lib.Features,
    labels: list[str],
    batch_size: int,
) -> list[list[str]]:
  logits_NxLxC = trainer.predict(params, feats.arrays, batch_size)
  return feats_lib.word_tags(feats, sents, np.argmax(logits_NxLxC, -1), labels)


def train_and_evaluate(
    enc: Encoder,
    splits: dict[str, conll.Sentences],
    recipe: finetuning.Recipe,
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
  labels = conll.label_list(splits["train"])
  unseen = sorted(set(conll.label_list(*splits.values())) - set(labels))
  if unseen:
    print(
        f"ner: tags {', '.join(unseen)} are not in the training file; they are scored but "
        "never predicted",
        flush=True,
    )
  feats = {k: feats_lib.build(enc.tokenizer, v, labels, max_seq_len) for k, v in splits.items()}
  print(
      "ner: "
      + ", ".join(f"{k} {len(splits[k])} sentences -> {len(f)} rows" for k, f in feats.items())
      + f"; {len(labels)} tags",
      flush=True,
  )
  total = finetuning.total_steps(feats["train"].arrays, recipe, packing)
  trainer = finetuning.Trainer(
      make_model(len(labels), packing), enc, recipe, total, ner_loss, "ner", packing=packing
  )
  predict = lambda params, split: tag(
      trainer, params, splits[split], feats[split], labels, recipe.eval_batch_size
  )
  evaluate = lambda params: metrics.score(splits["dev"].tags, predict(params, "dev"))
  result = finetuning.fit(
      trainer,
      feats["train"].arrays,
      recipe,
      evaluate,
      "f1",
      workdir,
      eval_untrained,
      progress,
      predicts=(feats["dev"].arrays,),
  )
  out = dict(best_epoch=result.best_epoch, dev=result.best, labels=labels, history=result.history)
  untrained = [h for h in result.history if h["epoch"] == 0]
  out["untrained"] = untrained[0] if untrained else None
  for split in [s for s in ("dev", "test") if s in splits]:
    predicted = predict(result.best_params, split)
    if split == "test":
      out["test"] = metrics.score(splits["test"].tags, predicted)
    if jax.process_index() == 0:
      conll.write_predictions(
          fs.path(workdir) / f"{split}_predictions.txt", splits[split], predicted
      )
  if jax.process_index() == 0:
    (fs.path(workdir) / "results.json").write_text(json.dumps(out, indent=2))
  finetuning.save_params(
      workdir,
      result.best_params,
      dict(
          task="ner",
          labels=labels,
          init=enc.source,
          dev=result.best,
          config=trainer.cfg.to_dict(),
          recipe=dataclasses.asdict(recipe),
          max_seq_len=max_seq_len,
          packing=packing,
          tokenizer=str(enc.tokenizer.path),
      ),
  )
  return result
