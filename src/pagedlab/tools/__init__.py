"""Tools (apps): the command line (cli.py), the live demo (demo.py, demo_keys.py), chat (chat.py), fetching a
model (fetch.py) and training the bundled model (train.py)."""
