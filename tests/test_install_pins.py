"""The GPU install can be installed: klsweep's pins, the installed verl's ``vllm`` extra and vLLM's own pins agree.

Read without a download: klsweep's ``pyproject.toml`` (``dependencies`` and the ``gpu`` extra), the installed verl's
``Requires-Dist`` (``importlib.metadata.requires("verl")``; its ``vllm`` extra names ``verl[verl-core]``, followed
too) and vLLM 0.24.0's ``Requires-Dist`` (``tests/data/vllm-0.24.0-requires.txt``, copied from its PyPI metadata).
``clashes`` finds a package whose requirements no version satisfies: the quick start's ``torch==2.13.0`` against
verl's and vLLM's ``torch==2.11.0`` is the case that broke the install. It judges pins (``==``) exactly; for
ranges alone it tries each version a specifier names, its next patch and its next release, so a gap narrower than
that is not seen (pip's resolver is the full check: ``pip install --dry-run --report - -e '.[gpu]'``).
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

REPO = Path(__file__).resolve().parents[1]
VLLM_REQUIRES = REPO / "tests" / "data" / "vllm-0.24.0-requires.txt"

Pin = tuple[str, Requirement]  # (who asks for it, the requirement)


def select(requires: list[str], extras: set[str], source: str) -> list[Pin]:
    """Takes a distribution's ``Requires-Dist`` lines; returns those that apply on this platform with ``extras``.

    A line applies when it has no marker, or its marker holds for the empty extra (the base requirements) or for
    one of ``extras`` (PEP 508 markers, evaluated by ``packaging`` against this Python and platform).
    """
    out = []
    for line in requires:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in {"", *extras}):
            out.append((source, req))
    return out


def gather(roots: list[Pin], requires_of: dict[str, tuple[str, list[str]]]) -> list[Pin]:
    """Takes requirements and, per package name, (version, ``Requires-Dist``) of the packages to follow; returns
    the roots and every requirement they pull in through those packages (each package and extra set once)."""
    out: list[Pin] = []
    todo, seen = list(roots), set()
    while todo:
        source, req = todo.pop(0)
        out.append((source, req))
        name = canonicalize_name(req.name)
        key = (name, frozenset(req.extras))
        if name not in requires_of or key in seen:
            continue
        seen.add(key)
        version, requires = requires_of[name]
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        todo += select(requires, set(req.extras), f"{name}{extras} {version}")
    return out


def _candidates(specs: list[SpecifierSet]) -> set[Version]:
    out = set()
    for spec in specs:
        for one in spec:
            try:
                v = Version(one.version.removesuffix(".*"))
            except InvalidVersion:
                continue
            parts = list(v.release)
            out |= {v, Version(".".join(map(str, [*parts, 1]))),
                    Version(".".join(map(str, [*parts[:-1], parts[-1] + 1])))}
    return out


def clashes(pins: list[Pin]) -> list[str]:
    """Takes requirements with who asks for each; returns one line per package no version satisfies, naming each
    specifier and its source. Empty when they can be installed together (as far as the module docstring says)."""
    by_name: dict[str, list[tuple[str, SpecifierSet]]] = defaultdict(list)
    for source, req in pins:
        by_name[canonicalize_name(req.name)].append((source, req.specifier))
    problems = []
    for name, asks in sorted(by_name.items()):
        specs = [spec for _, spec in asks if str(spec)]
        candidates = _candidates(specs)
        if specs and not any(all(s.contains(v, prereleases=True) for s in specs) for v in candidates):
            problems.append(f"{name}: no version satisfies " + "; ".join(
                f"{spec} ({source})" for source, spec in asks if str(spec)))
    return problems


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _followed() -> dict[str, tuple[str, list[str]]]:
    """verl as installed here, vLLM 0.24.0 from its copied metadata."""
    vllm = [line for line in VLLM_REQUIRES.read_text().splitlines() if line and not line.startswith("#")]
    return {"verl": (importlib.metadata.version("verl"), importlib.metadata.requires("verl") or []),
            "vllm": ("0.24.0", vllm)}


def _gpu_install(extra_args: list[str] = ()) -> list[Pin]:
    project = _pyproject()
    roots = [("klsweep", Requirement(r)) for r in project["dependencies"]]
    roots += [("klsweep[gpu]", Requirement(r)) for r in project["optional-dependencies"]["gpu"]]
    roots += [("the install command", Requirement(r)) for r in extra_args]
    return gather(roots, _followed())


def test_the_installed_verl_is_the_one_klsweep_pins():
    (pin,) = [Requirement(r) for r in _pyproject()["dependencies"] if Requirement(r).name == "verl"]
    assert Version(importlib.metadata.version("verl")) in pin.specifier


def test_klsweep_gpu_pins_and_verl_vllm_extra_and_vllm_can_be_installed_together():
    pins = _gpu_install()
    assert clashes(pins) == []
    # the extra was followed: verl's vllm extra and vLLM both pin torch, and so does the gpu extra
    torch = sorted((source, str(req.specifier)) for source, req in pins if req.name == "torch")
    assert torch == [("klsweep", ">=2.4"), ("klsweep[gpu]", "==2.11.0"), ("verl[vllm] 0.9.1", "==2.11.0"),
                     ("vllm 0.24.0", "==2.11.0")]
    assert ("verl[verl-core] 0.9.1", "TransferQueue>=0.1.10") in [(s, f"{r.name}{r.specifier}") for s, r in pins]


def test_a_torch_pin_that_clashes_is_named_with_every_source():
    # the CPU quick start's torch==2.13.0 beside the gpu extra: what ended in pip's ResolutionImpossible
    problems = clashes(_gpu_install(["torch==2.13.0"]))
    assert len(problems) == 1 and problems[0].startswith("torch: no version satisfies ")
    for source in ("(the install command)", "==2.11.0 (verl[vllm] 0.9.1)", "==2.11.0 (vllm 0.24.0)"):
        assert source in problems[0]


@pytest.mark.parametrize(("requires", "clash"), [
    (["transformers==5.10.0; extra == 'vllm'"], True),    # verl's vllm extra pins 5.9.0
    (["transformers<5.5; extra == 'vllm'"], True),        # verl and vLLM ask for >=5.5.3
    (["transformers>=5.9,<5.9.1; extra == 'vllm'"], False),
    (["transformers==5.9.0; extra == 'sglang'"], False),  # another extra: not followed
    (["fastapi<0.133; extra == 'verl-core'"], True),      # vLLM asks for >=0.133.0,<0.137.0
])
def test_a_doctored_verl_requirement_list(requires, clash):
    version, real = _followed()["verl"]
    followed = {**_followed(), "verl": (version, real + requires)}
    project = _pyproject()
    roots = [("klsweep[gpu]", Requirement(r)) for r in project["optional-dependencies"]["gpu"]]
    assert bool(clashes(gather(roots, followed))) is clash


def test_range_only_clashes_and_fits():
    def pins(*specs):
        return [(f"s{i}", Requirement(f"pkg{s}")) for i, s in enumerate(specs)]
    assert clashes(pins(">2.0", "<2.1")) == []          # 2.0.1
    assert clashes(pins(">=2.1", "<2.1")) == ["pkg: no version satisfies >=2.1 (s0); <2.1 (s1)"]
    assert clashes(pins("!=2.0.*", "==2.0.3")) != []
    assert clashes(pins("", "")) == []


def _readme_gpu_lines() -> list[str]:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [line for block in blocks for line in block.splitlines() if "'.[gpu]'" in line]


def test_the_readme_gpu_install_runs_in_its_own_venv_and_resolves():
    lines = _readme_gpu_lines()
    assert lines, "README.md has no bash block with the GPU install (pip install ... '.[gpu]')"
    for line in lines:
        m = re.search(r"python3 -m venv (\S+) && \1/bin/pip install (.+)$", line)
        assert m, f"the GPU install makes its own venv and uses its pip: {line}"
        assert m.group(1) != ".venv", "the CPU quick start's venv holds torch==2.13.0, which the GPU line replaces"
        args = [a.strip("'\"") for a in m.group(2).split() if not a.startswith("-") and "[gpu]" not in a]
        assert clashes(_gpu_install(args)) == []
