r"""BERT pretraining (MLM + NSP), from a CPU smoke run to the paper's BERT-base/large recipe.

Purpose: one config file for every model size. `arg` picks the variant:

  demo                           `bertjax demo`: tiny model, 2000 steps: 80% at batch 128 x
                                 seq 32, then 20% at batch 32 x seq 128; 30% masking
  tiny | mini | small | medium   CPU / single-accelerator scale on the bundled corpus
  base | large                   Devlin et al. 2018: batch 256 x 1M steps, 90% of the steps at
                                 seq 128 then 10% at seq 512, BERT's Adam (no bias correction)
                                 at lr 1e-4, 10k warmup steps, linear decay to 0 from step 0
  base_lamb | large_lamb         You et al. 2019 (LAMB): batch 64k at seq 128 for 7,038 steps,
                                 then 32k at seq 512 for 1,563 steps, each phase with its own
                                 warmup and decay

Command:
  bertjax pretrain --config experiments/pretrain.py:tiny --workdir runs/tiny
  bertjax pretrain --config experiments/pretrain.py:base --workdir gs://BUCKET/base \
      --config.data.path=gs://BUCKET/wiki_books_shards

Hardware and expected result:
  demo   2 CPU cores, about 10 min (make demo, install included): held-out accuracy at
         [MASK] ~3x the best constant guess, NSP accuracy ~0.6 (measured figures and the curve in docs/training.md).
  tiny   2 CPU cores, ~1.5 h at the defaults (2000 steps of 64 x 128).
  base   TPU v3-32 / v4-16 or 8 x A100 class, ~4 days in the paper (16 TPU chips);
         BERT-base reaches MLM accuracy ~0.70 and GLUE numbers of the paper's Table 1.
  large  64 TPU chips for ~4 days in the paper.

Every field is overridable: `--config.train.steps=100 --config.data.source=synthetic`.
"""

from __future__ import annotations

import ml_collections

# variant -> (model preset, global batch, steps, peak lr, warmup steps)
_SCALES = {
    "demo": ("tiny", 128, 2000, 1e-3, 300),
    "tiny": ("tiny", 64, 2000, 1e-3, 100),
    "mini": ("mini", 128, 10_000, 5e-4, 500),
    "small": ("small", 256, 20_000, 3e-4, 1000),
    "medium": ("medium", 256, 50_000, 2e-4, 2000),
    "base": ("base", 256, 1_000_000, 1e-4, 10_000),
    "large": ("large", 256, 1_000_000, 1e-4, 10_000),
}

# variant -> one line for `bertjax pretrain --help` (the docstring above has the details)
VARIANTS = {
    "demo": "`bertjax demo`: tiny model, 2,000 steps, seq 32 then 128, 30% masking (CPU, about 10 min)",
    "tiny": "tiny model (1.5M params), 2,000 steps of 64 x 128 (CPU, ~1.5 h)",
    "mini": "mini model (4 layers x 256), 10,000 steps of 128 x 128 (one accelerator)",
    "small": "small model (4 layers x 512), 20,000 steps of 256 x 128 (one accelerator)",
    "medium": "medium model (8 layers x 512), 50,000 steps of 256 x 128 (one accelerator)",
    "base": "BERT-base, the paper's recipe: 1M steps of 256, 90% at seq 128, then 512 (16 chips)",
    "large": "BERT-large, the paper's recipe: as base with 24 layers x 1024 (64 TPU chips)",
    "base_lamb": "BERT-base with LAMB: batch 64k at seq 128, then 32k at 512 (You et al. 2019)",
    "large_lamb": "BERT-large with LAMB: batch 64k at seq 128, then 32k at 512 (You et al. 2019)",
}


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
  """The config of one variant; see the module docstring for the list."""
  variant = arg or "tiny"
  lamb = variant.endswith("_lamb")
  scale = variant[: -len("_lamb")] if lamb else variant
  if scale not in _SCALES:
    raise ValueError(
        f"experiments/pretrain.py: unknown variant {arg!r}; valid: " f"{', '.join(VARIANTS)}"
    )
  preset, batch, steps, lr, warmup = _SCALES[scale]
  paper = scale in ("base", "large")

  c = ml_collections.ConfigDict()
  c.variant = variant  # recorded in the workdir's config.json
  c.seed = 0  # parameter init, dropout and data order

  c.model = ml_collections.ConfigDict()
  c.model.preset = preset  # tiny/mini/small/medium/base/large (bertjax.model.PRESETS)
  c.model.vocab_size = ml_collections.FieldReference(None, field_type=int)  # None: from data
  c.model.dtype = "bfloat16" if paper else "float32"  # compute; params stay float32
  c.model.hidden_dropout_rate = 0.1  # BERT's dropout
  c.model.attention_dropout_rate = 0.1
  c.model.max_position_embeddings = 512  # phase 2 runs at 512
  c.model.scan_layers = paper  # one compiled layer: fast compiles for 12/24 layers
  c.model.remat = "none"  # "dots"/"full" trade FLOPs for activation memory

  c.data = ml_collections.ConfigDict()
  c.data.source = "prepared"  # prepared (TFRecord shards) | synthetic (random tokens, no TF)
  c.data.path = ml_collections.FieldReference(None, field_type=str)  # None: bundled corpus
  c.data.tokenizer = ml_collections.FieldReference(
      None, field_type=str
  )  # None: data/tokenizer.model
  c.data.seq_len = 128  # tokens per example incl. [CLS]/[SEP]
  c.data.max_predictions_per_seq = 20  # masked positions per example (0.15 * 128, rounded)
  c.data.pair_mode = "nsp"  # nsp | sop | none (MLM only)
  c.data.mask_prob = 0.15  # share of tokens chosen for MLM
  c.data.prefetch = 2  # batches transferred ahead of the step
  c.data.packing = False  # several whole examples per row (docs/training.md, "Packing")
  c.data.max_examples_per_row = 8  # packed rows: at most this many examples (NSP labels) each

  c.train = ml_collections.ConfigDict()
  c.train.batch_size = batch  # GLOBAL sequences per step, all hosts and devices together
  c.train.steps = steps  # total optimizer steps, both phases
  c.train.learning_rate = lr  # peak, reached after warmup
  c.train.warmup_steps = warmup  # linear warmup from 0
  # bert_adamw (google-research/bert's, no bias correction) | adamw (optax's, bias-corrected)
  # | lamb (layer-wise). The paper recipes run BERT's optimizer and schedule; the small
  # recipes keep adamw + warmup_linear, the pair their figures in docs/training.md were
  # measured with; LAMB keeps warmup_linear for its restarted phase 2.
  c.train.optimizer = "lamb" if lamb else "bert_adamw" if paper else "adamw"
  # bert: peak * (1 - step/steps) from step 0, warmup overriding | warmup_linear: warmup, then
  # linear from the peak to 0
  c.train.schedule = "bert" if paper and not lamb else "warmup_linear"
  c.train.b1 = 0.9  # Adam beta1, as BERT
  c.train.b2 = 0.999  # Adam beta2, as BERT
  c.train.eps = 1e-6  # Adam epsilon, as BERT
  c.train.weight_decay = 0.01  # decoupled; not on LayerNorm or biases
  c.train.clip_norm = 1.0  # global gradient norm clip, as BERT
  c.train.microbatches = 1  # gradient accumulation: the batch is split into this many
  c.train.max_bad_steps = 0  # non-finite steps to skip before stopping (0: stop at the first)
  c.train.init_from = ml_collections.FieldReference(
      None, field_type=str
  )  # save_pretrained dir / workdir to continue from
  c.train.inject_nan_at_step = -1  # testing only: poison this step's loss to exercise the guard

  # Second phase (BERT: last 10% of steps at seq 512). fraction 0 = one phase.
  c.phase2 = ml_collections.ConfigDict()
  c.phase2.fraction = 0.1 if paper else 0.0  # share of train.steps run in phase 2
  c.phase2.seq_len = 512  # phase 2 sequence length
  c.phase2.max_predictions_per_seq = 80  # 0.15 * 512, as BERT's phase-2 data
  c.phase2.batch_size = batch  # GLOBAL batch in phase 2
  c.phase2.microbatches = 1  # gradient accumulation in phase 2
  c.phase2.restart_schedule = False  # True: own warmup/decay (LAMB); False: one schedule
  c.phase2.learning_rate = lr  # phase 2 peak (only with restart_schedule)
  c.phase2.warmup_steps = 0  # phase 2 warmup (only with restart_schedule)

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # pure data parallelism within a slice; -1 fills the devices left
  c.mesh.fsdp = 1  # FSDP (params + optimizer state split) within a slice
  c.mesh.tensor = 1  # tensor (model) parallelism within a slice
  c.mesh.dcn_data = 1  # data parallelism across slices / hosts over DCN
  c.mesh.dcn_fsdp = 1  # FSDP across slices (rarely worth it)
  c.mesh.dcn_tensor = 1  # tensor parallelism across slices (never worth it)

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every_steps = 500 if not paper else 5000  # async save interval
  c.checkpoint.max_to_keep = 3  # newest checkpoints kept
  c.checkpoint.keep_period = ml_collections.FieldReference(
      None, field_type=int
  )  # also keep every N-th step forever
  c.checkpoint.async_save = True  # write in the background while training continues

  c.eval = ml_collections.ConfigDict()
  c.eval.every_steps = 500 if not paper else 10_000  # held-out evaluation interval (0: never)
  c.eval.steps = 10 if not paper else 100  # eval batches per evaluation
  c.eval.batch_size = min(batch, 64) if not paper else 256  # GLOBAL eval batch

  c.log_every_steps = 50 if not paper else 100  # progress line / metrics.jsonl interval
  c.tensorboard = True  # also write TensorBoard event files (needs TensorFlow)
  c.peak_flops_per_device = ml_collections.FieldReference(
      None, field_type=float
  )  # MFU; None: from device kind

  if variant == "demo":  # minutes on CPU, a model that uses context (docs/training.md)
    # Short sequences first, as BERT's 128 -> 512: at seq 128 the tiny model stays on the
    # unigram plateau (predicting "," everywhere) for 2,000+ steps; at seq 32 it leaves it
    # after ~500. The last 20% at seq 128, with its own warmup and decay (at the tail of one
    # schedule the lr is too low to train the new positions), brings it to full length.
    c.data.seq_len = 32
    c.data.mask_prob = 0.3  # twice BERT's 15%: more predictions per step (Wettig et al. 2023)
    c.data.max_predictions_per_seq = 10  # 0.3 * 32
    c.phase2.fraction = 0.2
    c.phase2.seq_len = 128
    c.phase2.batch_size = 32  # the same tokens per step as phase 1
    c.phase2.max_predictions_per_seq = 40  # 0.3 * 128
    c.phase2.restart_schedule = True
    c.phase2.learning_rate = 1e-3
    c.phase2.warmup_steps = 50
    c.model.hidden_dropout_rate = 0.0  # tiny model, few epochs: nothing to regularise yet
    c.model.attention_dropout_rate = 0.0
    c.log_every_steps = 100
    c.checkpoint.every_steps = 500
    c.eval.every_steps = 250
    c.eval.steps = 8
    c.eval.batch_size = 128
  if lamb:  # You et al. 2019, table 4: 64k/32k mixed batch, 7038 + 1563 steps
    c.train.batch_size = 65536
    c.train.steps = 7038 + 1563
    c.train.learning_rate = 6e-3
    c.train.warmup_steps = 2000
    c.train.weight_decay = 0.01
    c.phase2.fraction = 1563 / (7038 + 1563)
    c.phase2.batch_size = 32768
    c.phase2.restart_schedule = True
    c.phase2.learning_rate = 4e-3
    c.phase2.warmup_steps = 200
    c.checkpoint.every_steps = 500
    c.log_every_steps = 10
  return c
