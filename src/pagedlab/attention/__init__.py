"""Attention backends: the only code that differs between stages inside the forward pass."""
