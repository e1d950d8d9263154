"""BERT in Flax linen: the network (`bert.py`), its kernels (`ops.py`), task heads (`heads.py`)
and parameter-tree helpers (`params.py`). `from bertjax import model` gives all of them."""

from bertjax.model.bert import (PRESETS, BertConfig, BertForPreTraining, BertModel,
                                EncoderOutput, PretrainingOutput, attention_mask_bias,
                                from_preset, gather_positions)
from bertjax.model.heads import (BertForQuestionAnswering, BertForSequenceClassification,
                                 BertForTokenClassification)
from bertjax.model.params import (count_params, dummy_inputs, stack_layer_params,
                                  unstack_layer_params)
