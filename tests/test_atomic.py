"""Atomic writes of folders: the old folder or the new one, never half of one, and no leftovers."""

from __future__ import annotations

import os

import pytest

from lmembed.atomic import atomic_folder


def test_a_folder_is_replaced_only_once_the_new_one_is_complete(tmp_path):
    target = tmp_path / "model"
    with atomic_folder(target) as tmp:
        (tmp / "a.txt").write_text("first")
        assert not target.exists()  # nothing is in place before the block ends
    assert (target / "a.txt").read_text() == "first"
    with atomic_folder(target) as tmp:
        (tmp / "b.txt").write_text("second")
        assert (target / "a.txt").read_text() == "first"  # the old folder stays readable meanwhile
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temporary or old folder left


def test_a_failed_write_leaves_the_old_folder_and_no_temporary_one(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "a.txt").write_text("old")
    with pytest.raises(RuntimeError, match="disk on fire"), atomic_folder(target) as tmp:
        (tmp / "half.txt").write_text("half")
        raise RuntimeError("disk on fire")
    assert sorted(p.name for p in target.iterdir()) == ["a.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_what_a_killed_write_left_is_removed_by_the_next_write_of_that_name(tmp_path):
    """Temporary names carry the writer (host, boot, PID namespace) and its pid: the next write of the same name
    removes the leftovers of an ended process of this machine, file or folder, and leaves a live writer's, another
    machine's and other names' alone (a longer name that holds this one and a pid included)."""
    import subprocess
    import sys

    from lmembed.atomic import _OWNER, atomic_folder, atomic_write_text, temp_prefix

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    dead, alive = ended.pid, os.getpid()
    left = {
        f".tmp-model-{_OWNER}-{dead}-aaaa1234": "dir",
        f".old-model-{_OWNER}-{dead}-bbbb1234": "dir",
        f".tmp-notes.txt-{_OWNER}-{dead}-cccc1234.txt": "file",
        f".tmp-model-{_OWNER}-{'9' * 10}-dddd1234": "dir",  # no process has such a pid: it ended
    }
    kept = {
        f".tmp-model-{_OWNER}-{alive}-eeee1234": "dir",  # a live writer's (this process)
        f".tmp-model-otherhost.0badcafe-{dead}-ffff1234": "dir",  # another machine's, on a shared drive
        f".tmp-models-{_OWNER}-{dead}-gggg1234": "dir",  # another name's
        f".tmp-model-{_OWNER}-{dead}-{_OWNER}-{alive}-hhhh1234": "dir",  # a live write of 'model-<owner>-<dead>'
        f".tmp-model-{_OWNER}-{'9' * 30}-iiii1234": "dir",  # not a name of ours (a pid has 10 digits at most)
    }
    for name, kind in {**left, **kept}.items():
        if kind == "dir":
            (tmp_path / name).mkdir()
            (tmp_path / name / "weights.bin").write_bytes(b"x" * 10)
        else:
            (tmp_path / name).write_text("half")
    with atomic_folder(tmp_path / "model") as folder:
        (folder / "a.txt").write_text("a")
    atomic_write_text(tmp_path / "notes.txt", "done")
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"model", "notes.txt", *kept}

    long_name = "a" * 240 + ".json"  # its temporary name would pass 255 bytes unshortened
    atomic_write_text(tmp_path / long_name, "{}")
    assert (tmp_path / long_name).read_text() == "{}" and len(temp_prefix(long_name)) < 160
