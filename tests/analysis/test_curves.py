"""klsweep.analysis.curves: the health rules' plain thresholds drawn as bands on the curves."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml

from klsweep.analysis.curves import thresholds
from klsweep.health import load_ruleset


def plain_thresholds(preset: str) -> dict[str, set[tuple]]:
    """Single-condition ``stat: value`` rules of a shipped preset, read straight from its YAML (not via klsweep)."""
    data = yaml.safe_load(resources.files("klsweep.health").joinpath("presets", f"{preset}.yaml").read_text())
    panels = {"ref_kl": "ref_kl", "entropy": "entropy", "actor/entropy": "entropy", "critic/score/mean": "score",
              "score": "score", "actor/kl_loss": "ref_kl"}
    out: dict[str, set[tuple]] = {"ref_kl": set(), "entropy": set(), "score": set()}
    for rule in data["rules"]:
        if "metric" in rule and rule.get("stat", "value") == "value" and rule["metric"] in panels:
            bound = "above" if "above" in rule else "below"
            out[panels[rule["metric"]]].add((rule["name"], rule["action"], bound, rule[bound]))
    out["ref_kl"].add(("kl_explosion (built-in)", "stop", "above", data["builtin"]["kl_explosion"]))
    return out


@pytest.mark.parametrize("preset", ["conservative", "default"])
def test_thresholds_are_the_presets_plain_thresholds(preset):
    got = {panel: {(b["rule"], b["action"], "above" if "above" in b else "below", b.get("above", b.get("below")))
                   for b in bands} for panel, bands in thresholds(load_ruleset(preset)).items()}
    assert got == plain_thresholds(preset)
    if preset == "conservative":  # the values the preset's description promises
        assert ("kl_blowup", "stop", "above", 0.5) in got["ref_kl"]
        # entropy is judged against the run's own start (scale-free): no plain line on the entropy panel
        assert not any(band[0] == "entropy_collapse" for band in got["entropy"])
