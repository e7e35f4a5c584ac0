import os

import pytest

from decisionkit.core.atomic import atomic_file, atomic_folder, write_text


def test_a_file_appears_whole_or_not_at_all(tmp_path):
    path = tmp_path / "sub" / "report.json"
    write_text(path, "first")
    assert path.read_text() == "first" and path.stat().st_mode & 0o777 == 0o644  # shared, unlike mkstemp's 600
    with pytest.raises(RuntimeError):
        with atomic_file(path) as scratch:
            scratch.write_text("half")
            raise RuntimeError("crash mid-write")
    assert path.read_text() == "first"  # the old content survives the crash
    assert os.listdir(path.parent) == ["report.json"]  # and no scratch file is left beside it


def test_a_folder_is_swapped_in_only_when_complete(tmp_path):
    path = tmp_path / "model"
    with atomic_folder(path) as scratch:
        (scratch / "a.txt").write_text("1")
        (scratch / "inner").mkdir()
        (scratch / "inner" / "b.txt").write_text("2")
        assert not path.exists()  # nothing is visible before the swap
    assert (path / "inner" / "b.txt").read_text() == "2"
    assert (path / "a.txt").stat().st_mode & 0o777 == 0o644 and path.stat().st_mode & 0o777 == 0o755
    with pytest.raises(RuntimeError):
        with atomic_folder(path) as scratch:
            (scratch / "a.txt").write_text("new")
            raise RuntimeError("crash mid-save")
    assert (path / "a.txt").read_text() == "1" and sorted(os.listdir(tmp_path)) == ["model"]
    with atomic_folder(path) as scratch:
        (scratch / "c.txt").write_text("3")
    assert sorted(os.listdir(path)) == ["c.txt"] and sorted(os.listdir(tmp_path)) == ["model"]  # old one removed
