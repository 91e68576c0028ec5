"""Tools (apps): the command line (cli.py: the parser, and the tools' own sub-commands; bench, serve and
assignment add theirs from bench/cli.py, serve/cli.py and course/cli.py), the live demo (demo.py, demo_keys.py),
chat (chat.py), fetching a model (fetch.py) and training the bundled model (train.py)."""
