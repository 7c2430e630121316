"""Process mode, with verl's command-line shape: ``python -m klsweep.trainers.embedded key=value ...``.

Overrides are parsed by Hydra's own override parser, the one ``verl.trainer.main_ppo`` uses, so values have the
types they would have for verl. Each step prints verl's console line (``step:N - key:value - ...``). When
``$VERL_FILE_LOGGER_PATH`` is set, it also appends verl's file-logger line ``{"step": N, "data": {...}}`` to that
file. As verl's ``FileLogger`` does, the file is truncated at start, unbuffered, and NaN is written as null. Exit
codes: 0 done; 2 bad overrides, with one line on stderr and no traceback.

Checkpoints follow verl's trainer keys (``RayPPOTrainer._save_checkpoint`` / ``_load_checkpoint``,
verl/trainer/ppo/ray_trainer.py):

- ``trainer.save_freq`` > 0 saves ``{trainer.default_local_dir}/global_step_N/`` every N steps and at the last one,
  and writes ``latest_checkpointed_iteration.txt``.
- ``trainer.resume_mode`` ``auto`` (the default) continues from the latest one there.
- ``resume_path`` continues from ``trainer.resume_from_path``. Interpolations such as
  ``${trainer.default_local_dir}/global_step_32`` are resolved as verl's Hydra config does.
- ``disable`` starts afresh.

A resumed run takes ``algorithm.kl_ctrl.kl_coef`` and the actor's learning rate from the overrides, since verl
rebuilds its KL controller from the config at every start. A remedied trial's segment thus reruns with its
prescription.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson  # verl's FileLogger writes with it (NaN becomes null); a verl dependency
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from klsweep.errors import OverrideError
from klsweep.trainers.embedded.config import as_int
from klsweep.trainers.restore import ACTOR_LR_KEY, KL_COEF_KEY, reapply_after_load
from klsweep.verl.config import compose


def parse_overrides(argv: list[str]) -> dict[str, Any]:
    """``["a.b=1", "c=k3+"]`` → ``{"a.b": 1, "c": "k3+"}`` with Hydra's override grammar.

    Raises:
        OverrideError: an argument that is not ``key=value`` in Hydra's grammar.
    """
    try:
        parsed = OverridesParser.create().parse_overrides(argv)
    except HydraException as e:
        raise OverrideError(f"cannot parse the overrides: {str(e).strip().splitlines()[0]}") from None
    return {o.get_key_element(): o.value() for o in parsed}


def console_line(step: int, metrics: dict[str, float]) -> str:
    """verl's console logger line, ``step:N - key:value - ...`` (``aggregate_logger.concat_dict_to_str``).

    Numpy scalars print as plain numbers (``0.25``), not as verl's ``np.float64(0.25)``.
    """
    return " - ".join([f"step:{step}", *(f"{k}:{_plain(v)!r}" for k, v in metrics.items())])


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number it holds (``item()``); anything else as it is."""
    return value.item() if type(value).__module__ == "numpy" and hasattr(value, "item") else value


#: verl's file naming the latest saved step in ``trainer.default_local_dir`` (verl.utils.checkpoint.checkpoint_manager).
LATEST_FILE = "latest_checkpointed_iteration.txt"


def checkpointing(overrides: Mapping[str, Any]) -> tuple[int, Path, Path | None]:
    """``(save_freq, default_local_dir, folder to resume from or None)`` as verl's trainer reads the overrides.

    Raises:
        OverrideError: ``trainer.save_freq`` is not an integer; ``resume_mode=resume_path`` without a
            ``global_step_N`` folder that exists (verl refuses it too), or a resume mode verl does not know.
    """
    cfg = compose(overrides).trainer
    every = as_int(cfg.save_freq, "trainer.save_freq")
    root, mode = Path(str(cfg.default_local_dir)), str(cfg.resume_mode)
    if mode == "disable":
        return every, root, None
    if mode == "resume_path":
        folder = Path(str(cfg.resume_from_path or ""))
        if "global_step_" not in folder.name or not folder.is_dir():
            raise OverrideError(f"trainer.resume_from_path={str(folder)!r} is not a global_step_N folder that exists: "
                                f"give a checkpoint a run with trainer.save_freq wrote under {root}")
        return every, root, folder
    if mode != "auto":
        raise OverrideError(f"trainer.resume_mode={mode!r}: use auto, disable or resume_path")
    latest = root / LATEST_FILE
    return every, root, (root / f"global_step_{latest.read_text().strip()}") if latest.is_file() else None


def main(argv: list[str] | None = None) -> int:
    """Train with the overrides in ``argv`` (default: ``sys.argv[1:]``), resuming as verl would.

    Returns the exit code: 0 done, 2 bad overrides (one line on stderr).
    """
    from klsweep.trainers.embedded.trainer import EmbeddedTrainer, run  # torch: only the process pays for it

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    path = os.environ.get("VERL_FILE_LOGGER_PATH")
    try:
        overrides = parse_overrides(list(sys.argv[1:] if argv is None else argv))
        trainer = EmbeddedTrainer(overrides)
        every, root, resume = checkpointing(overrides)
    except OverrideError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if resume is not None:
        trainer.load(resume)
        logging.getLogger(__name__).info("resumed from %s (step %d)", resume, trainer.global_step)
        given = {KL_COEF_KEY: trainer.settings.kl_ctrl.kl_coef, ACTOR_LR_KEY: trainer.settings.actor_lr}
        reapply_after_load(trainer, given, given)
    log_file = open(path, "wb", buffering=0) if path else None
    try:

        def report(step: int, metrics: dict[str, float]) -> None:
            print(console_line(step, metrics), flush=True)
            if log_file is not None:
                line = orjson.dumps({"step": step, "data": metrics}, option=orjson.OPT_SERIALIZE_NUMPY)
                log_file.write(line + b"\n")  # as verl's FileLogger
            if every > 0 and step > 0 and (step % every == 0 or step >= trainer.total_steps):
                trainer.save(root / f"global_step_{step}")
                (root / LATEST_FILE).write_text(str(step))

        run(overrides, report, trainer=trainer)
    finally:
        if log_file is not None:
            log_file.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
