"""Benchmarks (`bertjax bench`): figures and ratios against peers measured in the same run.

pretraining.py  the pretraining step: tokens/s, model FLOPs, MFU
profile.py      where that step's time goes, by model op (`--profile`)
peers.py        the Hugging Face peers (PyTorch, Flax) of the same model and batch
finetuning.py   one fine-tuning run + dev eval beside PyTorch (`bench finetune`)
input.py        the input pipeline: prepare, the shard readers, the stream (`bench input`)
"""
