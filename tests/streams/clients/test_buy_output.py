"""``buy --output FILE`` never touches a file that exists: a failed purchase used to delete it."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.clients.cli import main


def test_buy_output_refuses_an_existing_file_and_leaves_it_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kept = tmp_path / "outcome.json"
    kept.write_text('{"an": "earlier outcome"}')
    keys = tmp_path / "alice.key"
    assert main(["keygen", "--account", "alice", "--out", str(keys)]) == 0
    code = main(
        [
            "--broker",
            "kafka://127.0.0.1:1",
            "buy",
            "--key-file",
            str(keys),
            "--stream",
            "temp",
            "--max-price",
            "1",
            "--output",
            str(kept),
        ]
    )
    err = capsys.readouterr().err
    assert code != 0 and "the file exists" in err and "nothing was bought" in err, err
    assert "Traceback" not in err
    assert kept.read_text() == '{"an": "earlier outcome"}'
