"""The reference policy: the tiny transformer after a short supervised warm-up (SFT), cached on disk.

verl's actor starts from an SFT checkpoint, and its reference is that checkpoint's frozen copy. Here the SFT is
:data:`SFT_STEPS` steps of teacher forcing on right answers. It stops early on purpose, so the greedy gold accuracy
is moderate (see :data:`SFT_STEPS`). RL then has room both to improve it and to over-optimise the proxy.

The weights depend only on the task, the model size and :data:`REFERENCE_SEED`, not on a trial's ``data.seed``.
Every trial of a sweep thus starts from the same reference, as every verl trial starts from the same ``model.path``.
They are built once per machine and cached at ``$XDG_CACHE_HOME/klsweep/reference/<key>.pt`` (default
``~/.cache/klsweep/reference``). The file is written to a temporary name and renamed, so trials that start together
never read half a file. Both may build it; the rename is atomic and both results are identical.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import torch
from torch.nn import functional as F

from klsweep.trainers.embedded import task
from klsweep.trainers.embedded.config import MAX_RESPONSE_LENGTH, TASK_NAME
from klsweep.trainers.embedded.model import ModelSize, TinyTransformer, generate

logger = logging.getLogger(__name__)

SIZE = ModelSize(vocab_size=task.VOCAB_SIZE, max_length=task.PROMPT_LENGTH + MAX_RESPONSE_LENGTH)
"""The default (and only) model size: 2 layers, 64 wide, 4 heads (~105k parameters)."""

REFERENCE_SEED = 0
SFT_STEPS = 300
"""SFT steps (batch :data:`SFT_BATCH`, AdamW lr :data:`SFT_LR`); chosen so greedy gold accuracy is roughly 0.5."""
SFT_BATCH = 128
SFT_LR = 3e-3
SFT_JUNK_FRACTION = 0.15
"""Share of SFT examples with 1 to 4 junk digits between the answer and EOS: the SFT data is imperfect, so the
reference sometimes over-writes, and the proxy's length bias has samples to amplify (as in real RLHF)."""
SFT_RESPONSE_LENGTH = 8
CACHE_VERSION = "v2"
"""Bump when the task, the model or the warm-up changes, so stale cache files are not used."""


def cache_path(size: ModelSize = SIZE, seed: int = REFERENCE_SEED) -> Path:
    """Where the reference weights for this task, size and seed are cached."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"))
    return root / "klsweep" / "reference" / f"{TASK_NAME}-{size.name}-s{seed}-sft{SFT_STEPS}-{CACHE_VERSION}.pt"


def load_reference(size: ModelSize = SIZE, seed: int = REFERENCE_SEED) -> TinyTransformer:
    """The reference policy, loaded from the cache or built (:data:`SFT_STEPS` steps of SFT) and cached.

    Returns:
        A fresh :class:`TinyTransformer` holding the SFT weights (callers may train it).
    """
    path = cache_path(size, seed)
    model = TinyTransformer(size)
    if path.exists():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model
    logger.info("building the embedded reference policy (SFT warm-up, %d steps) -> %s", SFT_STEPS, path)
    model = warm_up(size, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, suffix=".tmp", delete=False) as tmp:
        try:
            torch.save(model.state_dict(), tmp)
        except BaseException:
            os.unlink(tmp.name)
            raise
    os.replace(tmp.name, path)
    return model


def warm_up(size: ModelSize = SIZE, seed: int = REFERENCE_SEED, steps: int = SFT_STEPS) -> TinyTransformer:
    """Supervised warm-up: minimise the cross-entropy of the SFT responses (answer digits, EOS).

    :data:`SFT_JUNK_FRACTION` of the responses carry 1 to 4 junk digits before EOS. Deterministic for a given seed:
    the model init and the data use their own generator.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = TinyTransformer(size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=SFT_LR)
    for _ in range(steps):
        batch = task.sample_train(SFT_BATCH, generator)
        targets = _with_junk(batch, generator)
        tokens = torch.cat([batch.prompts, targets], dim=1)
        logits = model(tokens[:, :-1])[:, task.PROMPT_LENGTH - 1 :]
        loss = F.cross_entropy(logits.reshape(-1, size.vocab_size), targets.reshape(-1), ignore_index=task.PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def _with_junk(batch: task.Batch, generator: torch.Generator) -> torch.Tensor:
    """SFT responses ``(batch, SFT_RESPONSE_LENGTH)``: the right response, or for a random share of the rows the
    answer, 1 to 4 random digits, then EOS."""
    n = batch.prompts.shape[0]
    targets = task.sft_targets(batch, SFT_RESPONSE_LENGTH)
    junk_rows = torch.rand(n, generator=generator) < SFT_JUNK_FRACTION
    junk_length = torch.randint(1, 5, (n,), generator=generator)
    junk_digits = torch.randint(0, 10, (n, SFT_RESPONSE_LENGTH), generator=generator)
    position = torch.arange(SFT_RESPONSE_LENGTH)[None, :]
    start, end = batch.answer_lengths[:, None], (batch.answer_lengths + junk_length)[:, None]
    is_junk = junk_rows[:, None] & (position >= start) & (position < end)
    targets = torch.where(is_junk, junk_digits, targets)
    is_eos = junk_rows[:, None] & (position == end)
    targets = torch.where(is_eos, torch.full_like(targets, task.EOS), targets)
    return torch.where(junk_rows[:, None] & (position > end), torch.full_like(targets, task.PAD), targets)


def gold_accuracy(model: TinyTransformer, max_response_length: int = 8) -> float:
    """Greedy gold accuracy of ``model`` on the validation prompts (fraction, 0 to 1)."""
    batch = task.validation_batch()
    responses = generate(model, batch.prompts, max_response_length, task.EOS, task.PAD)
    return float(task.gold_score(responses, batch).mean())
