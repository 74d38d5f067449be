"""forensics.output.open_output: never overwrite without --force, never leave half a file."""
import os
import stat

import pytest

from forensics.errors import InputError
from forensics.output import open_output


def test_new_file_gets_the_umask_mode_not_mkstemps_0600(tmp_path):
    old = os.umask(0o022)
    try:
        with open_output(str(tmp_path / "r.html")) as fh:
            fh.write("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.html").stat().st_mode) == 0o644
    assert (tmp_path / "r.html").read_text() == "x"


def test_existing_file_is_kept_unless_force(tmp_path):
    p = tmp_path / "r.json"
    p.write_text("mine")
    with pytest.raises(InputError, match="already exists"):
        with open_output(str(p)) as fh:
            fh.write("new")
    assert p.read_text() == "mine"
    with open_output(str(p), force=True) as fh:
        fh.write("new")
    assert p.read_text() == "new"
    assert [q.name for q in tmp_path.iterdir()] == ["r.json"]   # no temporary file left


def test_a_file_created_while_writing_is_not_overwritten(tmp_path):
    p = tmp_path / "r.md"
    with pytest.raises(InputError, match="already exists"):
        with open_output(str(p)) as fh:
            fh.write("ours")
            p.write_text("someone else's")       # appears between the check and the rename
    assert p.read_text() == "someone else's"
    assert [q.name for q in tmp_path.iterdir()] == ["r.md"]


def test_an_error_while_writing_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with open_output(str(tmp_path / "r.csv")) as fh:
            fh.write("half")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_missing_directory_is_one_clear_error(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        with open_output(str(tmp_path / "nope" / "r.html")):
            pass
