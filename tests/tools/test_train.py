"""`pagedlab train-tiny`: the recipe runs end to end and its output loads (a few steps only)."""

from pagedlab import load_model, oracle
from pagedlab.tools.train import TrainConfig, speeches, train_tiny


def test_speeches_split_on_blank_lines():
    assert speeches("A:\nhi\n\nB:\nyo\n\n\n") == ["A:\nhi", "B:\nyo"]


def test_a_short_training_run_saves_a_loadable_model(tmp_path):
    tc = TrainConfig(steps=3, batch_size=4, seq_len=32, hidden_size=32, num_layers=1, eval_batches=1)
    summary = train_tiny(tmp_path, tc)
    assert summary["parameters"] > 0 and summary["val_loss"] > 0
    loaded = load_model(tmp_path)
    out = oracle.greedy(loaded.model, loaded.tokenizer.encode("ROMEO:"), max_tokens=3)
    assert len(out.token_ids) <= 3


def test_training_is_seeded(tmp_path):
    tc = TrainConfig(steps=2, batch_size=2, seq_len=16, hidden_size=32, num_layers=1, eval_batches=1)
    assert train_tiny(tmp_path / "a", tc)["val_loss"] == train_tiny(tmp_path / "b", tc)["val_loss"]
