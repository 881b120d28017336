"""Shared by the tests of gpufeed.mds."""

import tempfile

import pytest


@pytest.fixture(autouse=True)
def _engine_locks_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's file locks (``<tempdir>/NNNNNN_*_filelock``, never deleted by it) go under pytest's temporary
    root, not the machine's /tmp."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path_factory.getbasetemp()))
