"""A model's revision in the request cache's key: what its responses come from, wherever the model lives."""

import os

import huggingface_hub.constants

from jobs.request_cache import revision


def snapshot(cache, commit: str, config: bytes) -> None:
    folder = cache / "models--org--m" / "snapshots" / commit
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes(config)
    (folder / "model.safetensors").write_bytes(b"weights " + commit.encode())


def test_a_hub_model_updated_in_the_local_cache_is_another_revision(tmp_path, monkeypatch):
    """Keyed by its name alone, a hub model whose cache moved to a new commit (a download of the updated
    model) answered every request from the old model's responses."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    snapshot(tmp_path, "a" * 40, b'{"v": 1}')
    snapshot(tmp_path, "b" * 40, b'{"v": 2}')
    refs = tmp_path / "models--org--m" / "refs"
    refs.mkdir()
    (refs / "main").write_text("a" * 40)
    first = revision("org/m")
    assert first.startswith("org/m@") and revision("org/m") == first
    (refs / "main").write_text("b" * 40)
    assert revision("org/m") != first
    assert revision("org/m", "a" * 40) == first  # a revision pinned in engine_kwargs
    assert revision("org/other") == "org/other"  # not in this machine's cache: its name, as before
    (tmp_path / "models--org--m" / "snapshots" / ("a" * 40) / "tokenizer.json").write_text("{}")
    assert revision("org/m", "a" * 40) == first  # a file downloaded later into the same commit: the same model
    assert revision("org/m", hub=False) == "org/m"  # a run's identity: the name (known before any download)


def test_a_one_file_model_rewritten_in_place_is_another_revision(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights")
    first = revision(str(gguf))
    gguf.write_bytes(b"new weights")
    os.utime(gguf, ns=(1, 1))
    assert revision(str(gguf)) != first
