"""Data prep's command line on an output it cannot write, and on a source whose sha256 is not the
one expected: one ``FAILED:`` line each, before any work, naming a flag the command has."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from components.data_prep import prep


def test_a_read_only_output_is_refused_in_one_line_before_any_work(
    read_only_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = read_only_folder / "dataset"
    with pytest.raises(SystemExit) as exited:
        prep.main(["--data-source", "bundled", "--output", str(output)])
    err = capsys.readouterr().err.splitlines()
    assert exited.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(
        f"FAILED: output {output}: this process cannot write in {read_only_folder}, where it "
    )
    assert list(read_only_folder.iterdir()) == []


def test_a_sha256_mismatch_names_the_flag_that_sets_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "mnist.npz"
    arrays = {"x_train": np.zeros((10, 28, 28), np.uint8), "y_train": np.zeros(10, np.uint8)}
    np.savez(source, **arrays, x_test=arrays["x_train"], y_test=arrays["y_train"])
    with pytest.raises(SystemExit):
        prep.main(["--data-source", str(source), "--output", str(tmp_path / "out")])
    (line,) = capsys.readouterr().err.splitlines()
    assert "pass its sha256 as --data-sha256, or --data-sha256 none not to check it" in line
