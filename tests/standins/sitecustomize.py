"""Makes ``python -m verl.trainer.main_ppo`` run the CPU stand-in ``verl_main_ppo.py`` of this directory.

Python imports ``sitecustomize`` at start-up from any directory on ``sys.path``, so with this directory on
``PYTHONPATH`` every Python process of a smoke run (the sweep driver, Ray's workers, the trials) imports it. Only a
process whose command line names ``verl.trainer.main_ppo`` (``sys.orig_argv``: ``python -m verl.trainer.main_ppo``,
or a klsweep wrapper that runs that module with ``runpy``, ``klsweep.launchers.own_ray``) is changed: its ``verl``
and ``verl.trainer`` packages are empty modules over the installed verl's directories (importing the real ones
loads torch, ~7 s), and a finder maps ``verl.trainer.main_ppo`` to the stand-in, which ``runpy`` then runs as
``__main__``. Every other process, the driver's verl config checks included, sees the installed verl unchanged.
"""

import importlib.abc
import importlib.util
import os
import sys
import types

_MODULE = "verl.trainer.main_ppo"


class _StandInFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != _MODULE:
            return None
        here = os.path.dirname(os.path.abspath(__file__))
        return importlib.util.spec_from_file_location(name, os.path.join(here, "verl_main_ppo.py"))


def _install():
    verl = importlib.util.find_spec("verl")
    if verl is None:  # no verl installed: the smoke check's precondition says so
        return
    root = verl.submodule_search_locations[0]
    for name, where in (("verl", root), ("verl.trainer", os.path.join(root, "trainer"))):
        module = types.ModuleType(name)
        module.__path__ = [where]
        sys.modules[name] = module
    sys.modules["verl"].trainer = sys.modules["verl.trainer"]
    sys.meta_path.insert(0, _StandInFinder())


if _MODULE in getattr(sys, "orig_argv", [])[1:]:
    _install()
