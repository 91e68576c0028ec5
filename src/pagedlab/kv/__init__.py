"""KV-cache bookkeeping: who owns which blocks. Pure Python: never imports torch."""
