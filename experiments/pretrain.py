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
  modern_base                    ModernBERT-base's network (Warner et al. 2024): 22 pre-LN
                                 layers x 768, GeGLU 1,152, RoPE, no biases, local 128-token
                                 attention with a global layer every 3rd; MLM alone at 30%,
                                 seq 1,024, the last 10% of the steps at seq 8,192 (ModernBERT's
                                 context extension, global RoPE theta 10k -> 160k); StableAdamW
                                 at lr 8e-4, warmup-stable-decay with a 1-sqrt decay
  modern_tiny                    the same network at tiny scale (3 layers x 128, window 32 at
                                 seq 128): CPU minutes on the bundled corpus, `bertjax demo
                                 --config modern_tiny`
  continue                       domain-adaptive pretraining (Gururangan et al. 2020) of a
                                 released checkpoint: `--init DIR` gives the network; MLM alone
                                 at 15%, seq 512, batch 256, lr 1e-4, 12,500 steps
  electra_small | electra_base   ELECTRA (Clark et al. 2020): replaced-token detection, a
                                 generator of 1/4 (Small) or 1/3 (Base) of the width; the
                                 paper's appendix hyperparameters (its Table 6)
  electra_tiny                   ELECTRA at tiny scale (2 layers x 128, embeddings 64, a
                                 32-wide generator): CPU minutes, `bertjax demo --config
                                 electra_tiny`

Command:
  bertjax pretrain --config experiments/pretrain.py:tiny --workdir runs/tiny
  bertjax pretrain --config experiments/pretrain.py:base --workdir gs://BUCKET/base \
      --config.data.path=gs://BUCKET/wiki_books_shards
  bertjax prepare --input 'my_domain/*.jsonl' --tokenizer roberta-base --output runs/domain
  bertjax pretrain --config continue --init roberta-base --workdir runs/dapt \
      --config.data.path=runs/domain

Hardware and expected result:
  demo   2 CPU cores, about 10 min (make demo, install included): held-out accuracy at
         [MASK] ~3x the best constant guess, NSP accuracy ~0.6 (measured figures and the curve in docs/training.md).
  tiny   2 CPU cores, ~1.5 h at the defaults (2000 steps of 64 x 128).
  base   TPU v3-32 / v4-16 or 8 x A100 class, ~4 days in the paper (16 TPU chips);
         BERT-base reaches MLM accuracy ~0.70 and GLUE numbers of the paper's Table 1.
  large  64 TPU chips for ~4 days in the paper.
  modern_base  compiled, not run: both phases fit on a v5p-32 (16 chips, data parallel), 11.1 GiB
         HBM per chip, every layer's attention the Pallas splash kernel (docs/performance.md).
  modern_tiny  2 CPU cores, minutes (`bertjax demo --config modern_tiny`; docs/training.md).
  electra_small  one accelerator: the paper trains it 4 days on one V100 (1M steps of 128).
  electra_tiny   2 CPU cores, ~25 min for 1,000 steps on busy cores (`bertjax demo --config
         electra_tiny`): its generator stays on the unigram plateau and its discriminator
         at the prior at this budget (measured figures in docs/training.md, "ELECTRA").

Every field is overridable: `--config.train.steps=100 --config.data.source=synthetic`.
"""

from __future__ import annotations

import ml_collections

from bertjax.data.masking import MaskSpec

# variant -> (model preset, global batch, steps, peak lr, warmup steps)
_SCALES = {
    "demo": ("tiny", 128, 2000, 1e-3, 300),
    "tiny": ("tiny", 64, 2000, 1e-3, 100),
    "mini": ("mini", 128, 10_000, 5e-4, 500),
    "small": ("small", 256, 20_000, 3e-4, 1000),
    "medium": ("medium", 256, 50_000, 2e-4, 2000),
    "base": ("base", 256, 1_000_000, 1e-4, 10_000),
    "large": ("large", 256, 1_000_000, 1e-4, 10_000),
    # BERT-base's batch and steps; `_modern` sets ModernBERT's optimizer, lr and schedule.
    "modern_base": ("base", 256, 1_000_000, 8e-4, 10_000),
    "modern_tiny": ("tiny", 32, 1000, 1e-3, 100),  # `tiny`'s lr and warmup, half its batch
    # The preset is a placeholder: `--init DIR` replaces the network by the checkpoint's.
    "continue": ("base", 256, 12_500, 1e-4, 750),
    # ELECTRA, Clark et al. 2020, appendix Table 6: batch, ELECTRA's train steps, lr, warmup
    # (the preset is a stand-in: `_electra` sets every size).
    "electra_small": ("small", 128, 1_000_000, 5e-4, 10_000),
    "electra_base": ("base", 256, 766_000, 2e-4, 10_000),
    "electra_tiny": ("tiny", 32, 1000, 1e-3, 100),  # `modern_tiny`'s batch, steps, lr, warmup
    # Contrastive training of an encoder on pairs (`_contrastive` sets the rest); `--init DIR`
    # gives the network. Batch: ModernBERT's retrieval recipe (Warner et al. 2024), 512;
    # Nomic's weakly supervised pretraining (Nussbaum et al. 2024), 16,384. Steps: one epoch is
    # the data's training rows / the batch; set --config.train.steps to it (the run's data
    # line says the rows). lr: ModernBERT's 8e-5; contrastive_pretrain's is ours (see below).
    "contrastive": ("base", 512, 1000, 8e-5, 50),
    "contrastive_pretrain": ("base", 16_384, 1000, 8e-5, 50),
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
    "modern_base": "ModernBERT-base: network, 30% MLM, StableAdamW + wsd, seq 1,024 then 8,192",
    "modern_tiny": "ModernBERT's network at tiny scale (3 layers x 128), seq 128 (CPU, minutes)",
    "continue": "continue MLM from a released checkpoint (--init DIR): seq 512, 12,500 steps",
    "electra_small": "ELECTRA-Small (Clark et al. 2020): 12 x 256, embeddings 128, 1M steps of 128",
    "electra_base": "ELECTRA-Base (Clark et al. 2020): 12 x 768, generator 1/3, 766k steps of 256",
    "electra_tiny": "ELECTRA at tiny scale (2 x 128, generator 32 wide), seq 128 (CPU, minutes)",
    "contrastive": "embedding fine-tuning on pairs (--init DIR): batch 512, 1 hard negative, scale 20",
    "contrastive_pretrain": "weakly supervised contrastive pretraining on pairs: batch 16,384, seq 128",
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
  # bf16, scanned layers, BERT's optimizer
  paper = scale in ("base", "large", "modern_base", "electra_small", "electra_base")

  c = ml_collections.ConfigDict()
  c.variant = variant  # recorded in the workdir's config.json
  c.seed = 0  # parameter init, dropout and data order
  # mlm: BERT's masked LM (+ the pair task) | electra: replaced-token detection (Clark et al.
  # 2020), a generator beside the encoder (bertjax.model.electra, docs/training.md "ELECTRA")
  c.objective = "mlm"
  c.electra = ml_collections.ConfigDict()  # read only with objective "electra"
  c.electra.generator_hidden_fraction = 0.25  # generator width / the encoder's (paper: 1/4)
  c.electra.disc_weight = 50.0  # λ: loss = generator MLM + λ · discriminator BCE (paper: 50)
  # read only with objective "contrastive" (docs/training.md "Contrastive"; defaults:
  # sentence-transformers' MultipleNegativesRankingLoss on a mean-pooled encoder)
  c.contrastive = ml_collections.ConfigDict()
  c.contrastive.pooling = "mean"  # mean over real tokens | cls: the [CLS] token's last state
  c.contrastive.normalize = True  # cosine scores (sentence-transformers' cos_sim)
  c.contrastive.scale = 20.0  # scores x scale (sentence-transformers: 20, temperature 0.05)
  c.contrastive.learn_scale = False  # learn log(scale) from `scale` (CLIP), clipped at 100
  c.contrastive.symmetric = False  # add the document->query term (averaged, as "per_direction")
  c.contrastive.loss = "infonce"  # infonce | sigmoid (SigLIP: a logistic term per pair)
  c.contrastive.sigmoid_bias = -10.0  # SigLIP's learned bias starts at -10
  c.contrastive.matryoshka_dims = ()  # e.g. (768, 256, 64): loss summed over these prefixes
  c.contrastive.chunk_size = 0  # GradCache rows per chunk (batches larger than memory); 0: off
  # hard negatives per row: the pair data must hold this many (`prepare --kind pairs` records
  # it); `bertjax compile` and the FLOPs count read it
  c.contrastive.hard_negatives = 1

  c.model = ml_collections.ConfigDict()
  c.model.preset = preset  # tiny/mini/small/medium/base/large (bertjax.model.PRESETS)
  c.model.vocab_size = ml_collections.FieldReference(None, field_type=int)  # None: from data
  c.model.dtype = "bfloat16" if paper else "float32"  # compute; params stay float32
  c.model.hidden_dropout_rate = 0.1  # BERT's dropout
  c.model.attention_dropout_rate = 0.1
  c.model.max_position_embeddings = 512  # phase 2 runs at 512
  c.model.scan_layers = paper  # one compiled layer: fast compiles for 12/24 layers
  c.model.remat = "none"  # "dots"/"full" trade FLOPs for activation memory
  # The block's switches, BERT's values here; `_modern` sets ModernBERT's (docs/training.md).
  c.model.type_vocab_size = 2  # segment A / segment B; 0: no token-type table
  c.model.norm_placement = "post"  # post: LayerNorm after each residual add | pre: before
  c.model.mlp_type = "dense"  # dense: act(x W1) W2 | glu: act(x W_in) * (x W_gate), then W_out
  c.model.position_embedding = "learned"  # learned: absolute table | rope: rotary
  c.model.rope_theta = 10000.0  # RoPE base of the global layers (rope only)
  c.model.local_rope_theta = 10000.0  # RoPE base of the local layers (rope only)
  c.model.use_bias = True  # biases of the dense layers and LayerNorms
  c.model.local_attention = 0  # 0: every layer global | window (tokens) of the local layers
  c.model.global_every = 1  # layer i is global when i % global_every == 0
  c.model.embedding_size = 0  # 0: hidden_size | ELECTRA's factorised embeddings, projected

  c.data = ml_collections.ConfigDict()
  c.data.source = "prepared"  # prepared (TFRecord shards) | synthetic (random tokens, no TF)
  c.data.path = ml_collections.FieldReference(None, field_type=str)  # None: bundled corpus
  c.data.tokenizer = ml_collections.FieldReference(
      None, field_type=str
  )  # None: data/tokenizer.model
  # Several prepared datasets mixed by weight instead of data.path (docs/data.md, "Mixtures"):
  # 'NAME=PATH:WEIGHT[:PHASE2_WEIGHT],...'; a weight is the share of the real training tokens.
  c.data.sources = ""
  c.data.seq_len = 128  # tokens per example incl. [CLS]/[SEP]
  c.data.max_predictions_per_seq = 20  # masked positions per example (0.15 * 128, rounded)
  c.data.pair_mode = "nsp"  # nsp | sop | none (MLM only)
  # The masking rates are BERT's, written once, in `bertjax.data.masking.MaskSpec`
  c.data.mask_prob = MaskSpec.mask_prob  # share of tokens chosen for MLM (BERT: 15%)
  # Mask every piece of a word together; on data prepared with `--word-segmenter`, every token
  # of a segmenter's word (Chinese whole-word masking: docs/data.md)
  c.data.whole_word_mask = False
  c.data.mask_token_prob = MaskSpec.mask_token_prob  # of the chosen: [MASK] (BERT: 80%)
  c.data.random_token_prob = MaskSpec.random_token_prob  # a random token (BERT: 10%); rest kept
  c.data.prefetch = 2  # batches transferred ahead of the step
  c.data.packing = False  # several whole examples per row (docs/training.md, "Packing")
  # packed rows: at most this many examples (NSP labels) each; 0: measured on the corpus
  c.data.max_examples_per_row = 0
  # Processes that build the examples (docs/data.md, "Worker processes"); None: half the cores.
  c.data.workers = ml_collections.FieldReference(None, field_type=int)

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
  c.train.decay_fraction = 0.1  # wsd: share of the steps in the final 1-sqrt decay
  c.train.final_lr_fraction = 0.0  # wsd: the lr at the last step / the peak
  c.train.peak_fraction = 0.5  # one_cycle: share of the steps rising to the peak (Cramming)
  # Batch-size warmup through the accumulation count (needs microbatches > 1): the first
  # batch_warmup_steps train on batch_warmup_start .. microbatches microbatches (0: off).
  c.train.batch_warmup_steps = 0
  c.train.batch_warmup_start = 1  # microbatches trained on at step 0
  c.train.max_bad_steps = 0  # non-finite steps to skip before stopping (0: stop at the first)
  c.train.init_from = ml_collections.FieldReference(
      None, field_type=str
  )  # save_pretrained dir / workdir to continue from
  c.train.inject_nan_at_step = -1  # testing only: poison this step's loss to exercise the guard
  # Continued pretraining from a checkpoint without a head this objective trains (a BertModel:
  # no MLM head): that head trains alone for these first steps, then the whole network.
  # -1: 10% of train.steps when a head starts untrained (0: off).
  c.train.head_warmup_steps = -1

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
  # Context extension: phase 2's own RoPE bases (None: config.model's).
  c.phase2.rope_theta = ml_collections.FieldReference(None, field_type=float)
  c.phase2.local_rope_theta = ml_collections.FieldReference(None, field_type=float)
  # A restarted phase 2's wsd / one_cycle shape (None: config.train's).
  c.phase2.decay_fraction = ml_collections.FieldReference(None, field_type=float)

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
  # Time to target (MLPerf's BERT metric): the first step and wall time at which held-out MLM
  # accuracy reaches this (None: not timed); stop_at_target ends the run there.
  c.eval.target_mlm_accuracy = ml_collections.FieldReference(None, field_type=float)
  c.eval.stop_at_target = False
  # The held-out stream's own data settings (None: config.data's / config.seed). A sweep whose
  # runs train on different data sets them so that every run is scored on the same masked
  # examples: experiments/modern.py evaluates each rung at 15% masking on single unpacked
  # segments from seed 0, whatever its training masking, pair task, packing or seed.
  c.eval.mask_prob = ml_collections.FieldReference(None, field_type=float)  # share masked
  c.eval.pair_mode = ml_collections.FieldReference(None, field_type=str)  # nsp | sop | none
  c.eval.packing = ml_collections.FieldReference(None, field_type=bool)  # several per row
  c.eval.seed = ml_collections.FieldReference(None, field_type=int)  # held-out order, masks
  # whole words or single tokens on the held-out stream (None: config.data.whole_word_mask)
  c.eval.whole_word_mask = ml_collections.FieldReference(None, field_type=bool)

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
  if scale.startswith("modern_"):
    _modern(c, tiny=scale == "modern_tiny")
  if variant == "continue":
    _continue(c)
  if scale.startswith("electra_"):
    _electra(c, scale.removeprefix("electra_"))
  if scale.startswith("contrastive"):
    _contrastive(c, pretrain=scale == "contrastive_pretrain")
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


def _modern(c: ml_collections.ConfigDict, tiny: bool) -> None:
  """ModernBERT-base's network and masking (Warner et al. 2024, "Smarter, Better, Faster,
  Longer"; the values of answerdotai/ModernBERT-base's config.json), at base or tiny scale.

  modern_base trains as ModernBERT-base (paper 2.2.3, and answerdotai/ModernBERT's training
  yaml): StableAdamW, the trapezoidal warmup-stable-decay schedule with a 1-sqrt decay, and the
  context extension as phase 2 with a raised global RoPE theta and its own decay. Its batch and
  step count stay `base`'s (1M steps of 256 x 1,024 tokens: 262B tokens, about an eighth of
  ModernBERT's ~2T), and batch-size warmup is off. modern_tiny keeps `tiny`'s adamw +
  warmup_linear and, in its one phase, the released model's global theta (160k): the settings
  its figures in docs/training.md were measured with.
  """
  m = c.model
  m.norm_placement = "pre"  # paper 2.1.1: pre-LN, a final norm, layer 0's attention norm identity
  m.mlp_type = "glu"  # paper 2.1.1: GeGLU (HF: hidden_activation "gelu", exact erf GELU)
  m.position_embedding = "rope"  # paper 2.1.1: rotary positions, no absolute table
  m.rope_theta = 160_000.0  # HF global_rope_theta (the paper's value after context extension)
  m.local_rope_theta = 10_000.0  # HF local_rope_theta
  m.use_bias = False  # paper 2.1.1: no bias in dense layers or LayerNorms (the decoder's stays)
  m.type_vocab_size = 0  # HF config has no type_vocab_size: no token-type embeddings
  m.global_every = 3  # HF global_attn_every_n_layers: layers 0, 3, 6, ... attend globally
  m.layer_norm_eps = 1e-5  # HF norm_eps
  m.hidden_dropout_rate = 0.0  # HF embedding_dropout / mlp_dropout 0.0
  m.attention_dropout_rate = 0.0  # HF attention_dropout 0.0 (and it lets TPUs run splash attention)
  m.initializer_range = 0.02  # HF initializer_range
  m.scan_layers = False  # layers differ (local/global, layer 0's norm): a scan needs them equal
  c.data.pair_mode = "none"  # paper 2.2.2: MLM alone, no next-sentence prediction
  c.data.mask_prob = 0.3  # paper 2.2.2: 30% masking (Wettig et al. 2023), not BERT's 15%
  if not tiny:
    m.num_layers = 22  # HF num_hidden_layers
    m.hidden_size = 768  # HF hidden_size
    m.num_heads = 12  # HF num_attention_heads (head size 64)
    m.intermediate_size = 1152  # HF intermediate_size: W_in 768 -> 2 x 1,152 (GLU)
    m.local_attention = 128  # HF local_attention: query i sees keys within +-64
    m.max_position_embeddings = 8192  # HF max_position_embeddings (RoPE: no table, a limit)
    # The vocabulary stays the data's (None: from the prepared data's tokenizer); ModernBERT's
    # is OLMo's BPE padded to 50,368 (HF vocab_size), which `--config.model.vocab_size=50368`
    # reproduces in `bertjax compile`.
    c.data.seq_len = 1024  # paper 2.2.3: 1.7T tokens at seq 1,024
    c.data.max_predictions_per_seq = 308  # 0.3 * 1,024, rounded up
    # The last 10% at seq 8,192: ModernBERT's context extension (paper 2.2.3: ~300B tokens at
    # 8,192 after 1.7T at 1,024), with the same tokens per step.
    c.phase2.fraction = 0.1
    c.phase2.seq_len = 8192  # HF max_position_embeddings
    c.phase2.max_predictions_per_seq = 2458  # 0.3 * 8,192, rounded up
    c.phase2.batch_size = c.train.batch_size * 1024 // 8192  # 32: 262,144 tokens per step
    m.rope_theta = 10_000.0  # paper 2.2.3: global theta 10,000 while training at 1,024 ...
    c.phase2.rope_theta = 160_000.0  # ... raised to 160,000 for 8,192 (HF global_rope_theta)
    c.train.optimizer = "stable_adamw"  # paper 2.2.3: StableAdamW (Wortsman et al. 2023)
    c.train.learning_rate = 8e-4  # paper 2.2.3: ModernBERT-base's peak lr
    c.train.b2 = 0.98  # ModernBERT's training yaml: betas (0.9, 0.98)
    c.train.eps = 1e-6  # ModernBERT's training yaml
    c.train.weight_decay = 1e-5  # paper 2.2.3 / training yaml: decoupled weight decay 1e-5
    c.train.clip_norm = 0.0  # StableAdamW's per-tensor update clipping replaces it
    c.train.schedule = "wsd"  # paper 2.2.3: trapezoidal (warmup-stable-decay)
    c.train.decay_fraction = 0.0  # phase 1 ends at the peak: the decay is phase 2's
    c.phase2.restart_schedule = True  # context extension: its own (lower) lr and decay
    c.phase2.learning_rate = 3e-4  # paper 2.2.3: context extension at lr 3e-4
    c.phase2.warmup_steps = 0  # continues from the stable phase, no new warmup
    c.phase2.decay_fraction = 0.17  # paper 2.2.3: 1-sqrt decay over the last ~50B of ~300B tokens
  else:  # the same network at CPU scale; the window is a quarter of the sequence, so it matters
    m.num_layers = 3  # one global layer (0), then two local ones, as ModernBERT's first three
    m.hidden_size = 128  # BERT-tiny's width
    m.num_heads = 2  # head size 64, as ModernBERT-base
    m.intermediate_size = 192  # 1.5 x hidden, ModernBERT-base's ratio (1,152 / 768)
    m.local_attention = 32  # query i sees keys within +-16 of 128 (ModernBERT: +-64 of 1,024)
    m.max_position_embeddings = 128  # RoPE: no table, only the longest sequence
    c.data.seq_len = 128  # one phase
    c.data.max_predictions_per_seq = 39  # 0.3 * 128, rounded up


def _continue(c: ml_collections.ConfigDict) -> None:
  """Domain-adaptive pretraining (DAPT, Gururangan et al. 2020, "Don't Stop Pretraining"): MLM
  on the user's corpus from a released checkpoint, which `--init DIR` names and whose network
  (every config.model field of `init_from.ADOPTED`, dropout included) replaces the preset's.
  Works with BERT, RoBERTa, XLM-R and ModernBERT checkpoints and bertjax runs alike."""
  # MLM alone: RoBERTa, XLM-R and ModernBERT have no NSP head (it would start untrained), and
  # RoBERTa's objective, which DAPT continues, has none. A BERT checkpoint with a trained NSP
  # head may turn it back on: --config.data.pair_mode=nsp.
  c.data.pair_mode = "none"
  c.data.mask_prob = 0.15  # BERT's and RoBERTa's rate, what the checkpoints were trained with
  c.data.seq_len = 512  # the checkpoints' full length (RoBERTa and DAPT train at 512)
  c.data.max_predictions_per_seq = 77  # 0.15 * 512
  # Steps: DAPT's 12,500 (Gururangan et al. 2020, section 3). Batch 256 and lr 1e-4: the
  # DAPT/TAPT commands of allenai/dont-stop-pretraining's README (run_language_modeling with
  # --learning_rate 0.0001, 16 x 16 accumulation). Set by `_SCALES["continue"]`.
  # Warmup: 750 steps, 6% of the steps, short so the first updates cannot undo the checkpoint
  # (a choice of this recipe, not the paper's).
  c.train.optimizer = "adamw"  # bias-corrected Adam, as transformers' Trainer (run_mlm)
  c.train.schedule = "warmup_linear"  # linear warmup, then linear decay to 0 (run_mlm's)
  c.train.b2 = 0.98  # RoBERTa's beta2 (Liu et al. 2019), stable at large batch
  c.train.eps = 1e-6  # RoBERTa's and BERT's epsilon
  c.train.weight_decay = 0.01  # RoBERTa's and BERT's
  c.model.dtype = "bfloat16"  # accelerator runs; --config.model.dtype=float32 on CPU
  c.phase2.fraction = 0.0  # one phase, at the checkpoint's length
  c.checkpoint.every_steps = 500
  c.eval.every_steps = 500
  c.log_every_steps = 50


def _contrastive(c: ml_collections.ConfigDict, pretrain: bool) -> None:
  """The encoder as an embedding model on pairs from `bertjax prepare --kind pairs`
  (docs/training.md, "Contrastive"): `contrastive` is ModernBERT's retrieval fine-tuning
  (Warner et al. 2024: batch 512, one mined hard negative, scale 20, lr 8e-5,
  one epoch), `contrastive_pretrain` Nomic's weakly supervised stage (Nussbaum et al. 2024,
  nomic-embed-text: batch 16,384 at seq 128), chunked so that its batch fits."""
  c.objective = "contrastive"
  c.data.pair_mode = "none"  # no pair task: the pairs are the task
  c.data.seq_len = 128  # Nomic: 128 in weakly supervised pretraining; ours for fine-tuning
  c.train.optimizer = "adamw"  # sentence-transformers trains with AdamW
  c.train.schedule = "warmup_linear"  # sentence-transformers' default: warmup, linear decay
  c.train.head_warmup_steps = 0  # no head starts fresh: the pooling has no parameters
  c.phase2.fraction = 0.0  # one phase
  c.contrastive.scale = 20.0  # ModernBERT's recipe; sentence-transformers' default
  c.contrastive.pooling = "mean"  # sentence-transformers' default pooling
  c.contrastive.hard_negatives = 1  # ModernBERT's recipe: one mined hard negative per query
  # Nomic's batch does not fit one accelerator's memory in one pass: GradCache in chunks of
  # 1,024 rows (ours; the gradient is the same at any chunk size, tests/test_contrastive.py).
  c.contrastive.chunk_size = 1024 if pretrain else 0
  c.eval.every_steps = 100  # held-out pairs: loss, top-1 accuracy, mean rank (ours)
  c.eval.steps = 2  # batches of eval.batch_size
  c.eval.batch_size = 64  # ours: held-out batches are small (2% of the rows)
  c.checkpoint.every_steps = 500  # ours


def _electra(c: ml_collections.ConfigDict, size: str) -> None:
  """ELECTRA (Clark et al. 2020, "ELECTRA: Pre-training Text Encoders as Discriminators Rather
  Than Generators"): sizes and pretraining hyperparameters of the paper's appendix (Table 6,
  "Pre-train hyperparameters") and of google-research/electra (configure_pretraining.py,
  pretrain/pretrain_helpers.py, model/optimization.py). `tiny` is the same recipe at CPU scale.
  """
  m = c.model
  c.objective = "electra"
  c.data.pair_mode = "none"  # paper section 2: no next-sentence prediction, one segment or two
  c.data.mask_prob = 0.15  # Table 6: mask percent 15 (Small and Base)
  c.data.mask_token_prob = 0.85  # pretrain_helpers.mask: [MASK] at 85% of the chosen tokens ...
  c.data.random_token_prob = 0.0  # ... the original at the other 15%, never a random token
  c.train.optimizer = "bert_adamw"  # optimization.py: BERT's Adam without bias correction
  c.train.schedule = "bert"  # Table 6: linear decay to 0 over the steps, linear warmup
  c.train.b1 = 0.9  # Table 6: Adam β1
  c.train.b2 = 0.999  # Table 6: Adam β2
  c.train.eps = 1e-6  # Table 6: Adam ε
  c.train.weight_decay = 0.01  # Table 6: weight decay (not on LayerNorms and biases)
  c.train.clip_norm = 1.0  # optimization.py: clip_by_global_norm(clip_norm=1.0)
  c.electra.disc_weight = 50.0  # paper section 3.1 / configure_pretraining.py: λ = 50
  m.hidden_dropout_rate = 0.1  # Table 6: dropout 0.1
  m.attention_dropout_rate = 0.1  # Table 6: attention dropout 0.1
  m.hidden_act = "gelu"  # modeling.py: BERT's exact GELU
  m.initializer_range = 0.02  # modeling.py: BERT's truncated normal, std 0.02
  m.scan_layers = size != "tiny"  # 12 identical layers: one compiled layer
  c.phase2.fraction = 0.0  # one phase: ELECTRA trains at one sequence length
  if size == "small":
    m.num_layers = 12  # Table 6: 12 layers
    m.hidden_size = 256  # Table 6: hidden size 256
    m.intermediate_size = 1024  # Table 6: FFN inner hidden size 1024
    m.num_heads = 4  # Table 6: 4 attention heads (head size 64)
    m.embedding_size = 128  # Table 6: embedding size 128, projected to 256
    c.electra.generator_hidden_fraction = 0.25  # Table 6: generator size 1/4 (64 wide, 1 head)
    c.data.seq_len = 128  # configure_pretraining.py: max_seq_length 128 for Small
    c.data.max_predictions_per_seq = 19  # configure_pretraining.py: int((0.15 + 0.005) * 128)
    c.train.batch_size = 128  # Table 6: batch size 128
    c.train.steps = 1_000_000  # Table 6: train steps (ELECTRA) 1M
    c.train.learning_rate = 5e-4  # Table 6: learning rate 5e-4
    c.train.warmup_steps = 10_000  # Table 6: warmup steps 10000
  elif size == "base":
    m.num_layers = 12  # Table 6: 12 layers
    m.hidden_size = 768  # Table 6: hidden size 768
    m.intermediate_size = 3072  # Table 6: FFN inner hidden size 3072
    m.num_heads = 12  # Table 6: 12 attention heads (head size 64)
    m.embedding_size = 768  # Table 6: embedding size 768 (no projection)
    c.electra.generator_hidden_fraction = 1 / 3  # Table 6: generator size 1/3 (256 wide, 4 heads)
    c.data.seq_len = 512  # configure_pretraining.py (larger models): max_seq_length 512
    c.data.max_predictions_per_seq = 79  # configure_pretraining.py: int((0.15 + 0.005) * 512)
    c.train.batch_size = 256  # Table 6: batch size 256
    c.train.steps = 766_000  # Table 6: train steps (ELECTRA) 766K
    c.train.learning_rate = 2e-4  # Table 6: learning rate 2e-4
    c.train.warmup_steps = 10_000  # Table 6: warmup steps 10000
  else:  # tiny: the recipe at CPU scale on the bundled corpus (docs/training.md, "ELECTRA")
    m.num_layers = 2  # BERT-tiny's depth
    m.hidden_size = 128  # BERT-tiny's width
    m.intermediate_size = 512  # 4 x hidden, as Table 6
    m.num_heads = 2  # head size 64, as Table 6
    m.embedding_size = 64  # factorised as ELECTRA-Small (half the hidden size), projected
    c.electra.generator_hidden_fraction = 0.25  # Table 6 (Small): generator 32 wide, 1 head
    m.hidden_dropout_rate = 0.0  # tiny model, few epochs: nothing to regularise yet (`demo`)
    m.attention_dropout_rate = 0.0
    m.max_position_embeddings = 128
    c.data.seq_len = 128  # as Small
    c.data.max_predictions_per_seq = 19  # int((0.15 + 0.005) * 128), as Small
    c.train.batch_size = 32  # `modern_tiny`'s batch
    c.train.steps = 1000  # `modern_tiny`'s steps
    c.train.learning_rate = 1e-3  # `tiny`'s lr
    c.train.warmup_steps = 100  # `tiny`'s warmup
    c.train.optimizer = "adamw"  # the small recipes' optimizer and schedule (`tiny`)
    c.train.schedule = "warmup_linear"
    c.log_every_steps = 50
    c.eval.every_steps = 250
    c.eval.steps = 8
    c.eval.batch_size = 64
