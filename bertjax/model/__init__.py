"""BERT in Flax linen: its config and presets (`config.py`), the network (`bert.py`), the
kernels it lowers through (`ops.py`), task heads (`heads.py`), ELECTRA's generator and
discriminator (`electra.py`) and parameter-tree helpers (`params.py`). `from bertjax import
model` gives all of them."""

from bertjax.model.bert import (
    BertForPreTraining,
    BertModel,
    EncoderOutput,
    PretrainingOutput,
    attention_mask_bias,
    gather_positions,
    packed_position_ids,
)
from bertjax.model.config import BertConfig, from_preset, PRESETS
from bertjax.model.electra import ElectraForPreTraining
from bertjax.model.heads import (
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertjax.model.params import (
    count_params,
    dummy_inputs,
    stack_layer_params,
    unstack_layer_params,
)
