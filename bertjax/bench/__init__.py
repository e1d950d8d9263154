"""Benchmarks (`bertjax bench`): figures and ratios against peers measured in the same run.

pretraining.py  the pretraining step and a fine-tuning epoch
peers.py        the Hugging Face peers (PyTorch, Flax) of the same model and batch
input.py        the input pipeline alone, in batches per second
"""
