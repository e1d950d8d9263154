"""Fine-tune a pretrained encoder on SQuAD and score it with the official EM/F1.

    run = train.train_and_evaluate(enc, train_examples, dev_examples, Options(version="2.0"),
                                   workdir)

SQuAD's adapter (`SquadTask`) for the fine-tuning runner (`bertjax.tasks.finetuning.run`).

Loss: the mean of the start and end cross-entropies over the window's positions (google's
run_squad). After each epoch the dev windows are predicted, decoded to answers (`decode`) and
scored (`evaluate`); the best epoch by F1 writes workdir/predictions.json (qid -> answer),
nbest_predictions.json, null_odds.json (v2.0) and results.json, and its parameters go to
workdir/best/ (orbax) with best.json.

Shape letters: B batch, L sequence length.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import optax

from bertjax import errors
from bertjax import model as model_lib
from bertjax.data.tokenizer import Tokenizer
from bertjax.runtime import fs
from bertjax.tasks import finetuning
from bertjax.tasks.encoder import Encoder
from bertjax.tasks.finetuning import Finished, Splits, Trainer, masked_mean
from bertjax.tasks.recipe import Recipe
from bertjax.tasks.squad import (
    cmrc2018,
    decode as decode_lib,
    evaluate as evaluate_lib,
    features as feats_lib,
)
from bertjax.tasks.squad.data import Example, SquadDataError, gold_answers


@dataclasses.dataclass(frozen=True)
class Options:
  """SQuAD-specific settings; the defaults are google-research/bert's run_squad."""

  version: str = "1.1"  # "1.1" or "2.0" (unanswerable questions, null answers)
  max_seq_len: int = 384  # tokens per window
  doc_stride: int = 128  # tokens between window starts
  max_query_length: int = 64  # question tokens kept
  n_best: int = 20  # start/end candidates per window, and answers in nbest_predictions.json
  max_answer_length: int = 30  # tokens
  null_threshold: float = 0.0  # v2.0: answer "" when null - best span score exceeds this
  eval_untrained: bool = False  # also score the model before training (epoch 0)
  # "squad": the official SQuAD EM/F1 (`evaluate`); "cmrc2018": CMRC 2018's EM and
  # character-level F1 (`cmrc2018`), for Chinese
  metric: str = "squad"


def squad_loss(outputs, batch: dict) -> jax.Array:
  """The mean over the windows of the start and end cross-entropies: over the batch's
  positions, or, on packed rows, over each window's own tokens (`packed_cross_entropy`)."""
  start_BxL, end_BxL = outputs
  if "segment_ids" in batch:
    ce = functools.partial(packed_cross_entropy, batch["segment_ids"], batch["cls_positions"])
  else:
    ce = optax.softmax_cross_entropy_with_integer_labels
  per_example_B = 0.5 * (
      ce(start_BxL, batch["start_positions"]) + ce(end_BxL, batch["end_positions"])
  )
  return masked_mean(per_example_B, batch["weights"])


def packed_cross_entropy(
    segment_ids_BxL: jax.Array, cls_BxE: jax.Array, logits_BxL: jax.Array, target_BxE: jax.Array
) -> jax.Array:
  """[B, E] cross-entropy of each packed window's position `target` (counted from its own
  [CLS], `cls_BxE`), the softmax over that window's tokens only (segment id e + 1). An empty
  slot gives 0."""
  slots_E = jnp.arange(1, cls_BxE.shape[1] + 1)
  mine_BxExL = segment_ids_BxL[:, None, :] == slots_E[None, :, None]
  masked_BxExL = jnp.where(mine_BxExL, logits_BxL[:, None, :], jnp.finfo(jnp.float32).min)
  log_z_BxE = jax.nn.logsumexp(masked_BxExL, axis=-1)
  at_BxE = jnp.clip(jnp.maximum(cls_BxE, 0) + target_BxE, 0, logits_BxL.shape[1] - 1)
  ce_BxE = log_z_BxE - jnp.take_along_axis(logits_BxL, at_BxE, axis=1)
  return jnp.where(mine_BxExL.any(-1), ce_BxE, 0.0)


def make_model(packing: int = 0):
  """The SQuAD head, packed rows or not (`packing`): it takes segment ids."""
  del packing
  return model_lib.BertForQuestionAnswering


def decode(
    examples: list[Example],
    feats: feats_lib.Features,
    start_NxL,
    end_NxL,
    tok,
    opts: Options,
) -> decode_lib.Decoded:
  """The answers of `examples` from their windows' start and end logits."""
  return decode_lib.decode(
      examples,
      feats,
      start_NxL,
      end_NxL,
      opts.version,
      tok,
      opts.n_best,
      opts.max_answer_length,
      opts.null_threshold,
  )


def score(examples: list[Example], dec: decode_lib.Decoded, opts: Options) -> dict[str, float]:
  """The official EM/F1 (and, v2.0, the no-answer breakdown) of the decoded answers; with
  `opts.metric` "cmrc2018" CMRC 2018's EM, F1 and their average."""
  if opts.metric == "cmrc2018":
    return cmrc2018.score(gold_answers(examples), dec.predictions)
  return evaluate_lib.score(
      gold_answers(examples),
      dec.predictions,
      opts.version,
      dec.null_odds if opts.version == "2.0" else None,
      dec.best_span,
  )


def predict_and_score(
    trainer: Trainer,
    params,
    tok,
    examples: list[Example],
    feats: feats_lib.Features,
    recipe: Recipe,
    opts: Options,
    progress: bool = False,
) -> tuple[dict[str, float], decode_lib.Decoded]:
  start_NxL, end_NxL = trainer.predict(params, feats.arrays, recipe.eval_batch_size, progress)
  dec = decode(examples, feats, start_NxL, end_NxL, tok, opts)
  return score(examples, dec, opts), dec


@dataclasses.dataclass
class SquadTask:
  """SQuAD as a `finetuning` adapter: the windows of `train` to train on, those of `dev` to
  score after each epoch and to answer with the best."""

  tok: Tokenizer
  train: list[Example]
  dev: list[Example]
  opts: Options
  max_position_embeddings: int  # the encoder's: no window may be longer
  test: list[Example] = dataclasses.field(default_factory=list)  # answered by the best epoch
  name = "squad"
  run_name = ""
  main_metric = "f1"

  @functools.cached_property
  def windows(self) -> tuple[feats_lib.Features, feats_lib.Features]:
    """The train and dev windows, built once."""
    opts = self.opts
    if opts.max_seq_len > self.max_position_embeddings:
      raise errors.ConfigError(
          f"Options.max_seq_len={opts.max_seq_len} exceeds the model's "
          f"max_position_embeddings={self.max_position_embeddings}"
      )
    build = lambda ex, training: feats_lib.build(
        self.tok, ex, opts.max_seq_len, opts.doc_stride, opts.max_query_length, training
    )
    train_feats, dev_feats = build(self.train, True), build(self.dev, False)
    answered = int((train_feats.arrays["start_positions"] > 0).sum())
    print(
        f"squad: train {len(self.train)} questions -> {len(train_feats)} windows ({answered} "
        f"hold the answer); dev {len(self.dev)} -> {len(dev_feats)}",
        flush=True,
    )
    if not len(train_feats) or not len(dev_feats):
      raise SquadDataError("the train or dev questions give no windows — nothing to train or score")
    return train_feats, dev_feats

  @functools.cached_property
  def test_windows(self) -> feats_lib.Features:
    opts = self.opts
    return feats_lib.build(
        self.tok, self.test, opts.max_seq_len, opts.doc_stride, opts.max_query_length, False
    )

  def features(self) -> Splits:
    train_feats, dev_feats = self.windows
    dev = {"dev": dev_feats.arrays}
    final = dict(dev, test=self.test_windows.arrays) if self.test else dev
    return Splits(train=train_feats.arrays, scored=dev, final=final)

  def head(self, cfg: model_lib.BertConfig) -> model_lib.BertForQuestionAnswering:
    return model_lib.BertForQuestionAnswering(cfg)

  def loss(self, outputs, batch: dict) -> jax.Array:
    return squad_loss(outputs, batch)

  def predictions(self, split: str, outputs) -> decode_lib.Decoded:
    start_NxL, end_NxL = outputs
    if split == "test":
      return decode(self.test, self.test_windows, start_NxL, end_NxL, self.tok, self.opts)
    return decode(self.dev, self.windows[1], start_NxL, end_NxL, self.tok, self.opts)

  def metric(self, predicted: dict[str, decode_lib.Decoded]) -> dict[str, float]:
    return score(self.dev, predicted["dev"], self.opts)

  def submission(self, predicted: dict[str, decode_lib.Decoded], run: Finished) -> dict:
    """predictions.json, nbest_predictions.json, null_odds.json (v2.0) and results.json."""
    dec, opts, result = predicted["dev"], self.opts, run.fit
    scores = score(self.dev, dec, opts)
    if jax.process_index() == 0:
      _write(run.workdir, "predictions.json", dec.predictions)
      _write(run.workdir, "nbest_predictions.json", dec.nbest)
      if opts.version == "2.0":
        _write(run.workdir, "null_odds.json", dec.null_odds)
      if "test" in predicted:
        _write(run.workdir, test_predictions_name(opts), predicted["test"].predictions)
      untrained = [h for h in result.history if h["epoch"] == 0]
      _write(
          run.workdir,
          "results.json",
          dict(
              version=opts.version,
              metric=opts.metric,
              best_epoch=result.best_epoch,
              dev=scores,
              untrained=untrained[0] if untrained else None,
              history=result.history,
          ),
      )
    return dict(
        task=f"squad{opts.version}",
        init=run.encoder.source,
        dev=scores,
        config=run.config.to_dict(),
        recipe=dataclasses.asdict(run.recipe),
        options=dataclasses.asdict(opts),
        packing=run.packing,
        tokenizer=str(getattr(self.tok, "path", "")),
    )


def test_predictions_name(opts: Options) -> str:
  """Where the test questions' answers go, under the workdir: CLUE's CMRC 2018 submission
  file (question id -> answer) with `metric` "cmrc2018", else test_predictions.json."""
  return (
      "submission/cmrc2018_predict.json" if opts.metric == "cmrc2018" else "test_predictions.json"
  )


def train_and_evaluate(
    enc: Encoder,
    train: list[Example],
    dev: list[Example],
    recipe: Recipe,
    opts: Options,
    workdir: str,
    progress: bool = True,
    packing: int = 0,
    test: list[Example] | None = None,
) -> finetuning.FitResult:
  """Fine-tune on the windows of `train`, score `dev` after each epoch, write the best
  epoch's predictions. `packing` > 0 packs up to that many windows into a row of
  `opts.max_seq_len` to train and predict (`finetuning.Trainer`), each window's start and end
  logits read from its own tokens; 0 one window a row. `test` questions (no answers needed)
  are answered by the best epoch into `test_predictions_name(opts)`."""
  task = SquadTask(enc.tokenizer, train, dev, opts, enc.config.max_seq_len, list(test or []))
  return finetuning.run(
      task,
      enc,
      recipe,
      workdir,
      packing=packing,
      eval_untrained=opts.eval_untrained,
      progress=progress,
  ).fit


def _write(workdir: str, name: str, obj) -> None:
  path = fs.path(workdir) / name
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(obj, indent=2, ensure_ascii=False))
