"""``python -m klsweep.launchers.own_ray MODULE ARGS...``: run ``python -m MODULE ARGS...`` (verl's
``verl.trainer.main_ppo``) with the dashboard agent of the Ray it starts on a free port.

Every Ray started with ``ray.init(address="local")``, as verl's ``main_ppo`` starts the trial's own, gives its
dashboard agent port 52365 (``DEFAULT_DASHBOARD_AGENT_LISTEN_PORT`` in ray/_private/ray_constants.py, the default
of ``RayParams.dashboard_agent_listen_port`` in ray/_private/parameter.py). ``ray.init`` takes no argument to change
it (ray/_private/worker.py builds ``RayParams`` without it). The first Ray of a host holds the port, the sweep's own
included. The agent of every other one retries six times ("Failed to bind to port 52365", ray/dashboard/
http_server_agent.py), then runs without its HTTP server and records port -1 (ray/dashboard/agent.py). Port 0 is
Ray's own "any free port": the agent reads back the port it bound and records that.

This module is klsweep's one repair of a private Ray internal: it sets the default of
``dashboard_agent_listen_port`` in ``ray._private.parameter.RayParams.__init__`` to 0, then runs the module as
``python -m`` does (:func:`runpy.run_module`). Checked against Ray 2.60. Where the internal has another shape, it
changes nothing and the module runs as before.
"""

from __future__ import annotations

import inspect
import runpy
import sys

#: The ``RayParams.__init__`` parameter set to 0.
AGENT_PORT = "dashboard_agent_listen_port"


def free_agent_port() -> bool:
    """Make port 0 the default of :data:`AGENT_PORT` for every Ray this process starts; whether it could."""
    try:
        from ray._private.parameter import RayParams
    except ImportError:
        return False
    init = RayParams.__init__
    parameters = list(inspect.signature(init).parameters.values())
    kw_defaults = dict(init.__kwdefaults__ or {})
    if AGENT_PORT in kw_defaults:
        init.__kwdefaults__ = kw_defaults | {AGENT_PORT: 0}
        return True
    positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    defaults = list(init.__defaults__ or ())
    if AGENT_PORT not in positional[len(positional) - len(defaults):]:
        return False
    defaults[positional.index(AGENT_PORT) - (len(positional) - len(defaults))] = 0
    init.__defaults__ = tuple(defaults)
    return True


def wrap(argv: list[str]) -> list[str]:
    """``[python, "-m", MODULE, *args]`` run through this module; any other command as it is."""
    if len(argv) >= 3 and argv[1] == "-m":
        return [argv[0], "-m", __name__, *argv[2:]]
    return argv


def _main() -> None:
    module, args = sys.argv[1], sys.argv[2:]
    free_agent_port()
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _main()
