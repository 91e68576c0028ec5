"""The `pagedlab` command line."""

import pytest

from pagedlab.cli import main


def test_generate_prints_the_prompt_and_its_continuation(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "ROMEO:", "--max-tokens", "8"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--- 'ROMEO:' (8 tokens, length" in out
    assert "\nROMEO:\nWhat sh\n" in out


def test_bad_model_folder_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="neither 'tiny-shakespeare' nor a folder"):
        main(["generate", "--model", str(tmp_path / "missing")])
