import errno
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


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def test_modes_follow_the_umask(tmp_path, umask_027):
    """What a plain open and mkdir make under umask 027 (640, 750), not mkstemp's private 600 nor a forced 644."""
    path = write_text(tmp_path / "report.json", "x")
    assert path.stat().st_mode & 0o777 == 0o640
    with atomic_folder(tmp_path / "model") as scratch:
        (scratch / "inner").mkdir()
        (scratch / "inner" / "b.txt").write_text("2")
    folder = tmp_path / "model"
    assert folder.stat().st_mode & 0o777 == (folder / "inner").stat().st_mode & 0o777 == 0o750
    assert (folder / "inner" / "b.txt").stat().st_mode & 0o777 == 0o640


def _synced_and_renamed(monkeypatch) -> list[tuple]:
    """Every fsync (the path its descriptor names) and rename, in order."""
    events, fsync, replace = [], os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
                        or fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: events.append(("replace", str(a), str(b))) or replace(a, b))
    return events


def test_a_file_is_flushed_before_its_rename_and_its_folder_after(tmp_path, monkeypatch):
    events = _synced_and_renamed(monkeypatch)
    path = write_text(tmp_path / "report.json", "x")
    (replaced,) = [e for e in events if e[0] == "replace"]
    assert replaced[2] == str(path)
    assert events == [("fsync", replaced[1]), replaced, ("fsync", str(tmp_path))]


def test_a_folder_is_flushed_whole_before_its_swap_and_its_parent_after(tmp_path, monkeypatch):
    path = tmp_path / "model"
    with atomic_folder(path) as scratch:
        (scratch / "old.txt").write_text("0")
    events = _synced_and_renamed(monkeypatch)
    with atomic_folder(path) as scratch:
        (scratch / "inner").mkdir()
        (scratch / "inner" / "b.txt").write_text("2")
        (scratch / "a.txt").write_text("1")
    swap = events.index(("replace", str(scratch), str(path)))
    synced = {e[1] for e in events[:swap] if e[0] == "fsync"}
    assert synced == {str(scratch), str(scratch / "inner"), str(scratch / "inner" / "b.txt"), str(scratch / "a.txt")}
    assert events[swap + 1:] == [("fsync", str(tmp_path))]  # the renames (old folder aside, new in) made durable


def test_a_filesystem_without_hard_links_gets_copies(tmp_path, monkeypatch):
    """os.link is made to fail as on a filesystem without hard links (EPERM: some network and FUSE mounts); every
    test filesystem here makes them, so the failure is simulated. Another error is not a missing feature: raised."""
    from decisionkit.core.atomic import link_or_copy

    source = tmp_path / "history.json"
    source.write_text("{}")
    calls = []

    def no_links(src, dst):
        calls.append(dst)
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    link_or_copy(source, tmp_path / "copy.json")
    assert calls and (tmp_path / "copy.json").read_text() == "{}"
    assert (tmp_path / "copy.json").stat().st_ino != source.stat().st_ino  # a copy, not a link
    monkeypatch.setattr(os, "link", lambda src, dst: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space")))
    with pytest.raises(OSError, match="No space"):
        link_or_copy(source, tmp_path / "full.json")
