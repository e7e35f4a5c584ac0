"""``core/atomic.py``'s folder swap under failure and contention: the second rename failing (an exception, or the
process killed between the two renames) leaves the previous folder whole where the module says, and saves of one
folder at once (threads, processes, a real model's ``save``) end with one whole version and no error."""

import copy
import inspect
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import contextmanager

import pytest
from safetensors.torch import load_file

from decisionkit.core.atomic import atomic_folder
from decisionkit.model import saving
from decisionkit.model.heads import Temperatures

FILES = ("a.txt", "b.txt", "inner/c.txt")


def fill(folder, label: str) -> None:
    """Every file of FILES holding ``label``, the larger ones big enough that writing them takes a moment."""
    for name in FILES:
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(label * (1 if name == "a.txt" else 20_000))


def version(folder) -> str:
    """The one label every file of a folder holds; fails on a folder with a file missing, extra or of another."""
    found = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert found == sorted(FILES), found
    label = (folder / "a.txt").read_text()
    assert all((folder / name).read_text() == label * (1 if name == "a.txt" else 20_000) for name in FILES), label
    return label


def save(path, label: str) -> None:
    with atomic_folder(path) as scratch:
        fill(scratch, label)


def failing_second_rename(monkeypatch, path) -> None:
    """``os.replace`` raises when the scratch folder would take ``path``'s place (the first rename, the old folder
    moved aside, goes through)."""
    real = os.replace

    def replace(src, dst):
        if os.fspath(dst) == os.fspath(path) and os.path.basename(src).startswith(f".{path.name}-"):
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)


def test_a_failing_second_rename_puts_the_previous_folder_back(tmp_path, monkeypatch):
    path = tmp_path / "model"
    save(path, "1")
    with monkeypatch.context() as patched:
        failing_second_rename(patched, path)
        with pytest.raises(OSError, match="No space left"):  # the caller sees the real cause
            save(path, "2")
    assert version(path) == "1" and sorted(os.listdir(tmp_path)) == ["model"]  # no scratch, no .model.old left
    save(path, "3")
    assert version(path) == "3" and sorted(os.listdir(tmp_path)) == ["model"]


KILLED = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from decisionkit.core.atomic import atomic_folder
    path, real = Path(sys.argv[1]), os.replace
    def replace(src, dst):  # killed (no cleanup, no finally) when the scratch folder would move into place
        if os.path.basename(src).startswith(f".{path.name}-"):
            os._exit(9)
        real(src, dst)
    os.replace = replace
    with atomic_folder(path) as scratch:
        (scratch / "a.txt").write_text("half")
""")


def test_a_save_killed_between_the_renames_leaves_the_previous_folder_at_dot_old(tmp_path, monkeypatch):
    path = tmp_path / "model"
    save(path, "1")
    killed = subprocess.run([sys.executable, "-c", KILLED, str(path)], capture_output=True, text=True, timeout=120)
    assert killed.returncode == 9, killed.stderr
    assert not path.exists() and version(tmp_path / ".model.old") == "1"  # whole, where the docstring says
    [killed_scratch] = set(os.listdir(tmp_path)) - {".model.old"}  # the kill skipped its cleanup: it stays
    left = sorted(["model", killed_scratch])
    with pytest.raises(RuntimeError), atomic_folder(path):
        raise RuntimeError("a save that fails before its swap")
    assert version(tmp_path / ".model.old") == "1"  # touches nothing
    with monkeypatch.context() as patched:  # the next swap puts the previous folder back first...
        failing_second_rename(patched, path)
        with pytest.raises(OSError):
            save(path, "2")
    assert version(path) == "1" and sorted(os.listdir(tmp_path)) == left  # ...so a failed one still leaves it
    os.replace(path, tmp_path / ".model.old")  # killed again; this time the next save goes through
    save(path, "3")
    assert version(path) == "3" and sorted(os.listdir(tmp_path)) == left


def test_threads_saving_one_folder_at_once_end_with_one_whole_version(tmp_path):
    path = tmp_path / "model"
    writers, rounds = 4, 15
    for round_ in range(rounds):
        start, errors = threading.Barrier(writers, timeout=60), []

        def writer(label: str) -> None:
            try:
                with atomic_folder(path) as scratch:
                    fill(scratch, label)
                    start.wait()  # every writer reaches its swap together
            except Exception as err:  # noqa: BLE001 - any error at all fails the test, with its message
                errors.append(repr(err))

        threads = [threading.Thread(target=writer, args=(f"{round_}:{n};",)) for n in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [], errors
        assert version(path) in {f"{round_}:{n};" for n in range(writers)}
        assert sorted(os.listdir(tmp_path)) == ["model"]


SAVER = "\n".join([f"FILES = {FILES!r}", inspect.getsource(fill), textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from decisionkit.core.atomic import atomic_folder
    path, label, go = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    time.sleep(max(0.0, go - time.time()))  # every process starts saving at the same moment
    for i in range(10):
        with atomic_folder(path) as scratch:
            fill(scratch, f"{label}.{i};")
""")])

def test_processes_saving_one_folder_at_once_end_with_one_whole_version(tmp_path):
    path = tmp_path / "model"
    go = time.time() + 2  # after each interpreter has started (a light import)
    savers = [subprocess.Popen([sys.executable, "-c", SAVER, str(path), f"p{n}", str(go)], stderr=subprocess.PIPE,
                               text=True) for n in range(3)]
    failures = [(p.wait(timeout=120), p.stderr.read()) for p in savers]
    assert all(code == 0 for code, _ in failures), failures
    assert version(path) in {f"p{n}.9;" for n in range(3)}  # some process's last save, whole
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_two_models_saved_into_one_folder_at_once_leave_one_whole_model(quick_model, tmp_path, monkeypatch):
    _, model = quick_model
    other = copy.copy(model)  # the same weights, other temperatures: a different decisionkit.json
    other.temperatures = Temperatures({kind: t + 1.0 for kind, t in model.temperatures.probabilities.items()})
    path, written, errors = tmp_path / "run", threading.Barrier(2, timeout=60), []
    model.save(path)  # a model there already: each save moves one aside

    @contextmanager
    def together(target):  # saving's atomic_folder, both saves swapping the moment both have written
        with atomic_folder(target) as scratch:
            yield scratch
            written.wait()

    monkeypatch.setattr(saving, "atomic_folder", together)

    def saver(m) -> None:
        try:
            for _ in range(8):
                m.save(path)
        except Exception as err:  # noqa: BLE001 - any error at all fails the test, with its message
            errors.append(repr(err))
            written.abort()  # the other saver stops waiting for this one

    threads = [threading.Thread(target=saver, args=(m,)) for m in (model, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert json.loads((path / saving.CONFIG_FILE).read_text())["temperatures"] in (
        model.temperatures.probabilities, other.temperatures.probabilities)
    heads = load_file(str(path / saving.HEADS_FILE))
    assert all((heads[f"heads.{k}"] == v).all() for k, v in model.heads.state_dict().items())
    assert sorted(os.listdir(tmp_path)) == ["run"]
