"""The reference policy: the shipped weights, and the warm-up recipe they come from."""

import torch

from klsweep.trainers.embedded import reference


def test_every_load_gives_the_shipped_weights_and_a_fresh_model():
    first, second = reference.load_reference(), reference.load_reference()
    shipped = torch.load(reference.REFERENCE_FILE, weights_only=True)
    assert all(torch.equal(first.state_dict()[k], v) for k, v in shipped.items())
    with torch.no_grad():
        first.lm_head.bias.add_(1.0)  # a caller trains its own copy
    assert torch.equal(second.lm_head.bias, shipped["lm_head.bias"])


def test_shipped_reference_has_the_moderate_gold_accuracy_it_was_built_with():
    assert reference.gold_accuracy(reference.load_reference()) == 157 / 256  # REFERENCE_FILE's docstring


def test_the_warm_up_recipe_gives_a_moderate_reference():
    """The recipe, rebuilt here: its accuracy depends on the thread count and CPU kernels (0.46-0.62 seen), so the
    shipped file is loaded, not rebuilt; any build is a moderate policy RL can improve and over-optimise."""
    assert 0.3 <= reference.gold_accuracy(reference.warm_up()) <= 0.7
