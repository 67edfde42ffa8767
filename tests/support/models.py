"""Small modules that several test modules lower, run or damage."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Pre-norm transformer block: attention and MLP, each behind a LayerNorm."""

    def __init__(self, dim: int = 32, heads: int = 4, causal: bool = False) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyViT(nn.Module):
    def __init__(self, dim: int = 48, depth: int = 1) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, kernel_size=4, stride=4)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, 17, dim))
        self.blocks = nn.Sequential(*[Block(dim, heads=4) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, 10)

    def forward(self, images):
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0]), x


class Decoder(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.block = Block(dim, causal=True)
        self.norm = nn.LayerNorm(dim)

    def forward(self, tokens):
        return self.norm(self.block(self.embed(tokens)))


class SmallBlock(nn.Module):
    """Linear, an affine LayerNorm and a GroupNorm reframed to a weight-less LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(12, 12)
        self.ln = nn.LayerNorm(12)
        self.gn = nn.GroupNorm(3, 6)

    def forward(self, x, y):
        return self.ln(self.proj(x)).relu(), self.gn(y) * 2.0


class DynamicModel(nn.Module):
    """LayerNorm over a dynamic number of rows, GroupNorm over a dynamic length."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.group_norm = nn.GroupNorm(2, 4, affine=False)

    def forward(self, x, y):
        return self.norm(x), self.group_norm(y)
