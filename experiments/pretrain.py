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

from bertjax.training import fields

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

  # Every field's default, comment and rule: bertjax/training/fields.py. Here: what the
  # variant sets, with its source.
  c = fields.base_config(
      {
          "variant": variant,  # recorded in the workdir's config.json
          "model.preset": preset,
          "train.batch_size": batch,
          "train.steps": steps,
          "train.learning_rate": lr,
          "train.warmup_steps": warmup,
          "phase2.batch_size": batch,  # phase 1's
          "phase2.learning_rate": lr,  # phase 1's peak (read only with restart_schedule)
          "eval.batch_size": 256 if paper else min(batch, 64),
      }
  )
  if paper:  # accelerator runs of up to 1M steps
    c.model.dtype = "bfloat16"  # compute; params stay float32
    c.model.scan_layers = True  # one compiled layer: fast compiles for 12/24 layers
    # BERT's optimizer and schedule (google-research/bert); LAMB's are set below
    c.train.optimizer = "bert_adamw"
    c.train.schedule = "bert"
    c.phase2.fraction = 0.1  # BERT: the last 10% of the steps at seq 512
    c.checkpoint.every_steps = 5000  # saves, evaluations and log lines at the run's scale
    c.eval.every_steps = 10_000
    c.eval.steps = 100
    c.log_every_steps = 100

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
    c.train.optimizer = "lamb"
    c.train.schedule = "warmup_linear"  # LAMB restarts it for phase 2
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
