"""The reference policy: cache location, cache use, moderate gold accuracy."""

import os

import torch

from klsweep.trainers.embedded import reference
from klsweep.trainers.embedded.model import TinyTransformer


def test_cache_path_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = reference.cache_path()
    assert path.parent == tmp_path / "klsweep" / "reference"
    assert path.name.startswith("arith-d64-l2-h4") and path.name.endswith(f"-{reference.CACHE_VERSION}.pt")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert str(reference.cache_path()).startswith(str(os.path.expanduser("~/.cache/klsweep/reference")))


def test_cached_weights_are_loaded_not_rebuilt(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    marker = TinyTransformer(reference.SIZE)
    torch.nn.init.constant_(marker.lm_head.bias, 0.125)
    reference.cache_path().parent.mkdir(parents=True)
    torch.save(marker.state_dict(), reference.cache_path())
    loaded = reference.load_reference()
    assert torch.equal(loaded.lm_head.bias, torch.full((reference.SIZE.vocab_size,), 0.125))


def test_reference_has_moderate_gold_accuracy():
    model = reference.load_reference()  # built on first use (~30 s), then cached
    assert 0.3 <= reference.gold_accuracy(model) <= 0.7
