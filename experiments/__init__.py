"""Experiment configs (ml_collections `get_config(arg)` files) for `bertjax pretrain`."""
