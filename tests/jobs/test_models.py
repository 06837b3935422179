import pytest

from jobs import models
from schemas.errors import UserError


def test_resolve_passes_hub_names_and_paths_through(tmp_path):
    assert models.resolve("meta-llama/Llama-3.1-8B-Instruct") == "meta-llama/Llama-3.1-8B-Instruct"
    assert models.resolve(str(tmp_path)) == str(tmp_path)


def test_unprepared_alias_says_how_to_prepare(monkeypatch, tmp_path):
    monkeypatch.setenv("RAGSIFT_HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="ragsift models prepare qwen2.5-coder-1.5b-instruct"):
        models.resolve("qwen2.5-coder-1.5b-instruct")


def test_unknown_alias_is_refused():
    with pytest.raises(UserError, match="unknown offline model"):
        models.prepare("gpt-17")


def test_the_defaults_are_prepared_by_setup():
    # `make test` runs the install script first, which prepares these
    for alias in (models.DEFAULT_GENERATOR, models.TEST_GENERATOR, models.DEFAULT_EMBEDDER):
        assert models.is_prepared(alias), alias


def test_wheels_pip_cannot_install_are_a_one_line_error_naming_them(monkeypatch, capsys):
    """A machine with no package index got pip's CalledProcessError as a traceback from `models prepare`."""
    from jobs.models import _pip_install
    from schemas.errors import UserError

    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    with pytest.raises(UserError, match="pip could not install ragsift-no-such-wheel==0.0.1"):
        _pip_install(["ragsift-no-such-wheel==0.0.1"])


def test_a_prepare_killed_midway_leaves_no_gigabytes_behind_once_another_runs(tmp_path):
    """Before, kill -9 during `models prepare` left models/tmpXXXX (up to a GGUF and its converted copy)
    that no later run removed."""
    import os
    import subprocess

    from jobs.models import STAGING, _clear_dead_staging, _host

    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f"{STAGING}{_host()}-{dead.pid}-x1" / "hf").mkdir(parents=True)
    (tmp_path / f"{STAGING}{_host()}-{dead.pid}-x1" / "model.gguf").write_bytes(b"part of a GGUF")
    (tmp_path / f"{STAGING}{_host()}-{os.getpid()}-x2").mkdir()  # a prepare running now
    (tmp_path / f"{STAGING}otherhost-{dead.pid}-x3").mkdir()  # another host's, on a shared home: its pid says nothing here
    (tmp_path / "smollm2-135m-instruct").mkdir()
    _clear_dead_staging(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{STAGING}{_host()}-{os.getpid()}-x2", f"{STAGING}otherhost-{dead.pid}-x3", "smollm2-135m-instruct"])


def test_a_prepared_folder_whose_weights_are_gone_is_not_ready_and_is_prepared_again(monkeypatch, tmp_path):
    """`models list` said "ready" and `prepare` returned at once; answer then failed on a folder with no weights."""
    monkeypatch.setenv("RAGSIFT_HOME", str(tmp_path))
    folder = models.model_dir(models.TEST_GENERATOR)
    folder.mkdir(parents=True)
    (folder / models.DONE_MARKER).write_text("x\n")
    (folder / "config.json").write_text("{}")
    assert not models.is_prepared(models.TEST_GENERATOR)
    with pytest.raises(FileNotFoundError, match=f"ragsift models prepare {models.TEST_GENERATOR}"):
        models.resolve(models.TEST_GENERATOR)
    (folder / "model.safetensors").write_bytes(b"weights")
    assert models.is_prepared(models.TEST_GENERATOR)


def test_prepare_refuses_an_unknown_name_before_preparing_the_names_given_before_it(monkeypatch):
    """`prepare smollm2-135m-instruct nope` converted the first model, then failed on the typo."""
    import argparse

    prepared = []
    monkeypatch.setattr(models, "prepare", prepared.append)
    with pytest.raises(UserError, match="unknown offline model.*'nope'"):
        models.run(argparse.Namespace(action="prepare", names=[models.TEST_GENERATOR, "nope"]))
    assert prepared == []


def test_models_without_an_action_asks_for_the_action_only(capsys):
    """It said "the following arguments are required: action, names", though `models list` takes no names."""
    import pytest

    from jobs.cli import main

    with pytest.raises(SystemExit):
        main(["models"])
    assert capsys.readouterr().err.rstrip().endswith("the following arguments are required: action")


def test_models_list_with_names_lists_only_those_and_an_unknown_name_is_refused_naming_the_known(monkeypatch, capsys):
    """`ragsift models list foo` ignored its names and listed every model."""
    import argparse

    monkeypatch.setattr(models, "is_prepared", lambda alias: False)
    assert models.run(argparse.Namespace(action="list", names=[models.TEST_GENERATOR])) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 1 and listed[0].startswith(models.TEST_GENERATOR)
    with pytest.raises(UserError, match=f"unknown offline model.*'foo'; known: .*{models.DEFAULT_GENERATOR}"):
        models.run(argparse.Namespace(action="list", names=["foo"]))
    models.run(argparse.Namespace(action="list", names=[]))
    assert len(capsys.readouterr().out.splitlines()) == len(models.REGISTRY)
