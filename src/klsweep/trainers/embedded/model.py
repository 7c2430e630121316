"""A tiny causal transformer (GPT-2 shape, pre-LayerNorm) with a language-model head and a value head.

The actor and the reference use the language-model head. The critic (``algorithm.adv_estimator=gae``) is a
separate copy of the same network that uses the value head. verl's critic is likewise a separate model initialised
from the SFT weights. Sizes are tiny so that one RL step takes tens of milliseconds on one CPU core.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class ModelSize:
    """Shape of the network.

    Attributes:
        vocab_size: tokens in the vocabulary.
        max_length: longest sequence (prompt + response tokens) the position embedding covers.
        d_model: width of the residual stream.
        n_layers: transformer blocks.
        n_heads: attention heads per block (``d_model`` must divide by it).
    """

    vocab_size: int
    max_length: int
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4

    @property
    def name(self) -> str:
        """Short tag used in the reference cache file name, e.g. ``d64-l2-h4``."""
        return f"d{self.d_model}-l{self.n_layers}-h{self.n_heads}-v{self.vocab_size}-t{self.max_length}"


class Block(nn.Module):
    """Pre-LN transformer block: ``x + attn(ln(x))`` then ``x + mlp(ln(x))``, causal attention."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor] | None = None) -> torch.Tensor:
        """``x`` ``(batch, length, d_model)``. With ``cache`` (keys and values of earlier positions, updated in
        place; empty at the first call) ``x`` holds the positions after the cached ones (incremental decoding)."""
        batch, length, width = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.n_heads, width // self.n_heads).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            if cache:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            cache[:] = [k, v]
        # causal within x; a single new position attends to everything before it
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=length > 1)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.ln2(x))


class TinyTransformer(nn.Module):
    """Causal transformer over token ids ``(batch, length)``.

    ``forward`` returns next-token logits ``(batch, length, vocab_size)``; ``values`` returns one value per
    position ``(batch, length)`` from the value head (used only by the critic copy).
    """

    def __init__(self, size: ModelSize):
        super().__init__()
        self.size = size
        self.token_embedding = nn.Embedding(size.vocab_size, size.d_model)
        self.position_embedding = nn.Embedding(size.max_length, size.d_model)
        self.blocks = nn.ModuleList(Block(size.d_model, size.n_heads) for _ in range(size.n_layers))
        self.ln_final = nn.LayerNorm(size.d_model)
        self.lm_head = nn.Linear(size.d_model, size.vocab_size)
        self.value_head = nn.Linear(size.d_model, 1)

    def hidden(self, tokens: torch.Tensor, caches: list[list[torch.Tensor]] | None = None) -> torch.Tensor:
        """Final hidden states ``(batch, length, d_model)``; ``caches`` (one list per block) for decoding."""
        start = caches[0][0].shape[2] if caches and caches[0] else 0
        positions = torch.arange(start, start + tokens.shape[1])
        x = self.token_embedding(tokens) + self.position_embedding(positions)[None]
        for i, block in enumerate(self.blocks):
            x = block(x, caches[i] if caches is not None else None)
        return self.ln_final(x)

    def forward(self, tokens: torch.Tensor, caches: list[list[torch.Tensor]] | None = None) -> torch.Tensor:
        return self.lm_head(self.hidden(tokens, caches))

    def values(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.value_head(self.hidden(tokens)).squeeze(-1)


@torch.no_grad()
def generate(
    model: TinyTransformer,
    prompts: torch.Tensor,
    max_response_length: int,
    eos_id: int,
    pad_id: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Sample responses ``(batch, max_response_length)`` token by token; greedy when ``generator`` is None.

    A response ends after its first EOS; later positions hold ``pad_id``. Sampling draws from
    ``softmax(logits / temperature)`` with the given generator only, so the global RNG is untouched.
    """
    batch = prompts.shape[0]
    tokens = prompts
    caches: list[list[torch.Tensor]] = [[] for _ in model.blocks]
    new = prompts  # positions not yet in the key/value caches
    finished = torch.zeros(batch, dtype=torch.bool)
    for _ in range(max_response_length):
        logits = model(new, caches)[:, -1, :]
        if generator is None:
            next_token = logits.argmax(dim=-1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            next_token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        next_token = torch.where(finished, torch.full_like(next_token, pad_id), next_token)
        new = next_token[:, None]
        tokens = torch.cat([tokens, new], dim=1)
        finished |= next_token == eos_id
        if bool(finished.all()):
            break
    responses = tokens[:, prompts.shape[1] :]
    return F.pad(responses, (0, max_response_length - responses.shape[1]), value=pad_id)
