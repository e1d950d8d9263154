"""Mistakes table rows (see test_mistakes.py) for the pretrain commands."""

from mistakes_common import Mistake

ROWS: list[Mistake] = []
