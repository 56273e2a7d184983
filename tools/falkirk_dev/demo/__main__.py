"""``python -m falkirk_dev.demo``."""

from falkirk_dev.demo import run

run()
