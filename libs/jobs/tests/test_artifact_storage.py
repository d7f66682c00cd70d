"""LocalStorage: temp-then-rename writes, key validation, the backend registry."""

from __future__ import annotations

import pytest

from jacana_jobs import ArtifactStorage, InvalidKey, LocalStorage, make_storage, register_storage


def files_under(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_write_read_exists_delete(tmp_path):
    store = LocalStorage(tmp_path)
    assert not store.exists("video/a.mp4")
    with store.writer("video/a.mp4") as f:
        f.write(b"frames")
    assert store.exists("video/a.mp4")
    with store.open("video/a.mp4") as f:
        assert f.read() == b"frames"
    assert store.path_for("video/a.mp4") == tmp_path / "video" / "a.mp4"
    assert files_under(tmp_path) == ["video/a.mp4"]
    assert store.delete("video/a.mp4") is True
    assert store.delete("video/a.mp4") is False
    with pytest.raises(FileNotFoundError):
        store.open("video/a.mp4")


def test_nothing_is_visible_under_the_key_until_the_writer_finishes(tmp_path):
    store = LocalStorage(tmp_path)
    with store.writer("v/b.mp4") as f:
        f.write(b"half")
        assert not store.exists("v/b.mp4")
        assert [p.name.startswith(".b.mp4.") for p in (tmp_path / "v").iterdir()] == [True]
    assert store.exists("v/b.mp4")


def test_a_writer_that_raises_leaves_nothing(tmp_path):
    store = LocalStorage(tmp_path)
    with pytest.raises(RuntimeError, match="render crashed"), store.writer("v/c.mp4") as f:
        f.write(b"partial")
        raise RuntimeError("render crashed")
    assert not store.exists("v/c.mp4")
    assert files_under(tmp_path) == []


def test_a_failed_rewrite_keeps_the_previous_artifact(tmp_path):
    store = LocalStorage(tmp_path)
    with store.writer("v/d.mp4") as f:
        f.write(b"good")
    with pytest.raises(ValueError), store.writer("v/d.mp4") as f:
        f.write(b"bad")
        raise ValueError
    with store.open("v/d.mp4") as f:
        assert f.read() == b"good"
    assert files_under(tmp_path) == ["v/d.mp4"]


@pytest.mark.parametrize(
    "key",
    ["", "/etc/passwd", "../x", "a/../../x", "a/./b", "a//b", ".hidden", "a/.b.tmp", "a\\b",
     "a/b/", "x" * 2000, "sp ace"],
)  # fmt: skip
def test_unsafe_keys_are_refused_by_every_operation(tmp_path, key):
    store = LocalStorage(tmp_path / "root")
    for op in (store.exists, store.open, store.delete, store.path_for):
        with pytest.raises(InvalidKey):
            op(key)
    with pytest.raises(InvalidKey), store.writer(key):
        pass
    assert not (tmp_path / "x").exists()


def test_registry_builds_local_and_names_the_known_backends(tmp_path):
    store = make_storage("local", root=tmp_path)
    assert isinstance(store, LocalStorage) and store.root == tmp_path
    with pytest.raises(ValueError, match=r"unknown storage backend 's3' \(known: .*local"):
        make_storage("s3")
    with pytest.raises(ValueError, match="already registered"):
        register_storage("local")(LocalStorage)
    assert issubclass(LocalStorage, ArtifactStorage)
