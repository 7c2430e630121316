"""Process mode, with verl's command-line shape: ``python -m klsweep.trainers.embedded key=value ...``.

Overrides are parsed by Hydra's own override parser (the one ``verl.trainer.main_ppo`` uses), so values have the
types they would have for verl. Each step prints verl's console line (``step:N - key:value - ...``) and, when
``$VERL_FILE_LOGGER_PATH`` is set, appends verl's file-logger line ``{"step": N, "data": {...}}`` to that file
(truncated at start, unbuffered, NaN written as null: verl's ``FileLogger``). Exit codes: 0 done, 2 bad overrides
(one line on stderr, no traceback).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from klsweep.errors import OverrideError


def parse_overrides(argv: list[str]) -> dict[str, Any]:
    """``["a.b=1", "c=k3+"]`` → ``{"a.b": 1, "c": "k3+"}`` with Hydra's override grammar.

    Raises:
        OverrideError: an argument that is not ``key=value`` in Hydra's grammar.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(argv)
    except HydraException as e:
        raise OverrideError(f"cannot parse the overrides: {str(e).strip().splitlines()[0]}") from None
    return {o.get_key_element(): o.value() for o in parsed}


def console_line(step: int, metrics: dict[str, float]) -> str:
    """verl's console logger line (``verl.utils.logger.aggregate_logger.concat_dict_to_str``)."""
    return " - ".join([f"step:{step}", *(f"{k}:{v!r}" for k, v in metrics.items())])


def main(argv: list[str] | None = None) -> int:
    """Train with the given overrides; see the module docstring."""
    import orjson  # verl's FileLogger writes with it (NaN becomes null); a verl dependency

    from klsweep.trainers.embedded.trainer import EmbeddedTrainer, run

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    path = os.environ.get("VERL_FILE_LOGGER_PATH")
    try:
        overrides = parse_overrides(list(sys.argv[1:] if argv is None else argv))
        trainer = EmbeddedTrainer(overrides)
    except OverrideError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    log_file = open(path, "wb", buffering=0) if path else None
    try:

        def report(step: int, metrics: dict[str, float]) -> None:
            print(console_line(step, metrics), flush=True)
            if log_file is not None:
                line = orjson.dumps({"step": step, "data": metrics}, option=orjson.OPT_SERIALIZE_NUMPY)
                log_file.write(line + b"\n")  # as verl's FileLogger

        run(overrides, report, trainer=trainer)
    finally:
        if log_file is not None:
            log_file.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
