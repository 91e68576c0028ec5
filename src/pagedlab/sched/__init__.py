"""Schedulers: who runs this step and with how many tokens. Pure Python: never imports torch."""
