"""Mistakes table rows (see test_mistakes.py) for the finetune commands."""

from mistakes_common import Mistake

ROWS: list[Mistake] = []
