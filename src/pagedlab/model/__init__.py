"""The model: config, decoder, loader, tokenizer (shared by every stage)."""
