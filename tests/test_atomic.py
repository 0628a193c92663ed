"""Atomic writes of folders: the old folder or the new one, never half of one, and no leftovers."""

from __future__ import annotations

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
