"""The reference policy: the tiny transformer after a short supervised warm-up (SFT), shipped as a file.

verl's actor starts from an SFT checkpoint, and its reference is that checkpoint's frozen copy. Here the SFT is
:data:`SFT_STEPS` steps of teacher forcing on right answers (:func:`warm_up`). It stops early on purpose, so the
greedy gold accuracy is moderate (see :data:`SFT_STEPS`). RL then has room both to improve it and to over-optimise
the proxy.

The weights are shipped in the package (:data:`REFERENCE_FILE`), as every verl trial starts from the same
``model.path``. Building them at first use would not give every trial, process and machine the same start: the SFT's
floating-point sums depend on torch's thread count and CPU kernels, and the greedy gold accuracy of :func:`warm_up`'s
result ranges from 0.46 to 0.62 over 1-4 threads on one machine (torch 2.13.0, x86_64 AVX2), with curves and health
verdicts that differ from step 1. ``python -m klsweep.trainers.embedded.reference PATH`` rebuilds the file (2 torch
threads, as shipped); a new file changes every embedded trial, so the benchmark tables and equivalence records are
recorded again with it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.nn import functional as F

from klsweep.trainers.embedded import task
from klsweep.trainers.embedded.config import MAX_RESPONSE_LENGTH
from klsweep.trainers.embedded.model import ModelSize, TinyTransformer, generate

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


#: The shipped reference weights: :func:`warm_up` with :data:`REFERENCE_SEED` and :data:`SIZE`, 2 torch threads,
#: torch 2.13.0 on x86_64 (AVX2); greedy gold accuracy 157/256 on the validation prompts.
REFERENCE_FILE = Path(__file__).with_name("reference.pt")
#: torch threads the shipped file was built with (:func:`main`).
BUILD_THREADS = 2


def load_reference() -> TinyTransformer:
    """A fresh :class:`TinyTransformer` holding the shipped SFT weights (:data:`REFERENCE_FILE`), for the caller to
    train."""
    model = TinyTransformer(SIZE)
    model.load_state_dict(torch.load(REFERENCE_FILE, weights_only=True))
    return model


def warm_up(size: ModelSize = SIZE, seed: int = REFERENCE_SEED, steps: int = SFT_STEPS) -> TinyTransformer:
    """Supervised warm-up: minimise the cross-entropy of the SFT responses (answer digits, EOS).

    :data:`SFT_JUNK_FRACTION` of the responses carry 1 to 4 junk digits before EOS. The model init and the data use
    their own generator, so the result depends only on the seed, torch's thread count and its CPU kernels.
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


def main(argv: list[str] | None = None) -> int:
    """Rebuild the reference weights into the file named in ``argv`` (default: ``sys.argv[1:]``); prints its greedy
    gold accuracy. Returns 0, or 2 without exactly one path."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m klsweep.trainers.embedded.reference PATH", file=sys.stderr)
        return 2
    torch.set_num_threads(BUILD_THREADS)
    model = warm_up()
    torch.save(model.state_dict(), args[0])
    print(f"{args[0]}: greedy gold accuracy {gold_accuracy(model):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
