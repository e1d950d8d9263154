"""bertjax: BERT pretraining, ablations and GLUE evaluation in JAX/Flax.

The model (`bertjax.model`) and the Hugging Face import (`bertjax.interop.convert`) import
without TensorFlow; the input pipeline and data preparation use tf.data.
"""

__version__ = "0.1.0"
