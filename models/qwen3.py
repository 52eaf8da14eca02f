"""Qwen3 and Qwen3-MoE: Llama with an RMSNorm over d_head of each q and k head.

The q/k norm runs per head, before the rotation (HF Qwen3Attention's q_norm/k_norm).
Qwen3 configs also give head_dim explicitly (Qwen3-0.6B: 16 heads of 128 in a
hidden size of 1024), which ModelConfig.head_dim already carries. Qwen3-MoE replaces the
MLP of every layer by the top-k mixture of experts of models/moe.py.
"""

from __future__ import annotations

from .llama import Llama, RMSNorm
from .moe import MoE


class Qwen3(Llama):
    qk_norm = RMSNorm


class Qwen3Moe(Qwen3):
    mlp = MoE
