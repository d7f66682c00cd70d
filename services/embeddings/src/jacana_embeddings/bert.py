"""A BERT-style bidirectional encoder in plain torch (BERT, RoBERTa, XLM-R, MiniLM…).

Post-LayerNorm transformer: embeddings (word + absolute position + token type) ->
LayerNorm -> N x [self-attention, residual, LayerNorm, MLP, residual, LayerNorm].
Batches are packed (:mod:`jacana_embeddings.varlen`): every token-wise layer runs on the
real tokens only, and attention sees a right-padded view whose padding never influences
real tokens (key mask). Dense layers go through a :class:`LinearBackend` chosen at load
time (torch's ``F.linear`` or oneDNN's fused linear + activation). Weights are owned by
the module and live on its device; the module holds no per-request state, so one
instance serves every batch (from one worker thread at a time).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from jacana_common.linear_backends import ACTIVATIONS, LinearBackend, TorchLinear
from jacana_embeddings.errors import ModelLoadError
from jacana_embeddings.varlen import PackedLayout


@dataclass(frozen=True)
class BertConfig:
    """Shapes and constants of one encoder, read from the model's ``config.json``.

    ``position_offset``: the position id of the first token (0 for BERT; RoBERTa-style
    models count from ``pad_token_id + 1``). ``positions_skip_pad``: RoBERTa-style
    position ids, where a pad token id inside the input keeps ``pad_token_id`` as its
    position (what the reference implementation does).
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str
    pad_token_id: int
    position_offset: int = 0
    positions_skip_pad: bool = False

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ModelLoadError(
                f"hidden_size {self.hidden_size} is not a multiple of {self.num_heads} heads"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ModelLoadError(f"unsupported hidden_act {self.hidden_act!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_input_tokens(self) -> int:
        """Longest input the position table can hold."""
        return self.max_position_embeddings - self.position_offset


class _Layer(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.head_dim
        self.qkv = nn.Linear(h, 3 * h)  # query, key, value fused: one GEMM instead of three
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.mlp_in = nn.Linear(h, cfg.intermediate_size)
        self.mlp_out = nn.Linear(cfg.intermediate_size, h)
        self.mlp_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.act = cfg.hidden_act

    def forward(self, x: torch.Tensor, layout: PackedLayout, dense: LinearBackend) -> torch.Tensor:
        # x: [T, H] packed real tokens
        b, s = layout.batch_size, layout.max_len
        qkv = dense.linear(x, self.qkv.weight, self.qkv.bias)  # [T, 3H]
        qkv = layout.to_padded(qkv).view(b, s, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, heads, S, head_dim]
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=layout.attention_mask)
        attn = layout.to_packed(attn.transpose(1, 2))  # [T, H]
        x = self.attn_norm(x + dense.linear(attn, self.attn_out.weight, self.attn_out.bias))
        h = dense.linear(x, self.mlp_in.weight, self.mlp_in.bias, self.act)  # [T, I]
        return self.mlp_norm(x + dense.linear(h, self.mlp_out.weight, self.mlp_out.bias))


class BertEncoder(nn.Module):
    """``forward_packed(ids [T], layout) -> [T, H]``; ``forward(ids [B, S], mask) -> [B, S, H]``.

    ``dense`` runs the linear layers; set it once after loading (default: torch).
    """

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.dense: LinearBackend = TorchLinear()
        h = cfg.hidden_size
        self.word_embeddings = nn.Embedding(cfg.vocab_size, h)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, h)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, h)
        self.embed_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(_Layer(cfg) for _ in range(cfg.num_layers))

    def position_ids(self, input_ids: torch.Tensor, layout: PackedLayout) -> torch.Tensor:
        # input_ids: [T] packed -> [T]
        if self.cfg.positions_skip_pad:
            real = (input_ids != self.cfg.pad_token_id).to(torch.int64)
            return layout.segment_cumsum(real) * real + self.cfg.pad_token_id
        return layout.positions() + self.cfg.position_offset

    def forward_packed(self, input_ids: torch.Tensor, layout: PackedLayout) -> torch.Tensor:
        # input_ids: [T] int64, the inputs of ``layout`` end to end -> last hidden [T, H]
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(self.position_ids(input_ids, layout))
            + self.token_type_embeddings.weight[0]  # single segment: token type 0 everywhere
        )
        x = self.embed_norm(x)  # [T, H]
        for layer in self.layers:
            x = layer(x, layout, self.dense)
        return x

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Right-padded batch in, ``[B, S, H]`` out (zeros at padding)."""
        # input_ids: [B, S] int64; attention_mask: [B, S] bool, a prefix of each row
        layout = PackedLayout(attention_mask.sum(dim=1).tolist(), input_ids.device)
        hidden = self.forward_packed(input_ids[attention_mask], layout)  # [T, H]
        out = hidden.new_zeros(*input_ids.shape, hidden.shape[-1])  # [B, S, H]
        out[attention_mask] = hidden
        return out

    def load_hf_weights(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy weights named as in HF ``BertModel`` (prefix already stripped) into self.

        Raises :class:`ModelLoadError` naming the first missing or misshapen tensor.
        """
        own = self.state_dict()
        for name, value in _hf_to_own(tensors, self.cfg.num_layers).items():
            if name not in own:
                continue
            if own[name].shape != value.shape:
                raise ModelLoadError(
                    f"weight {name}: shape {tuple(value.shape)}, expected {tuple(own[name].shape)}"
                )
            own[name].copy_(value)
        missing = set(own) - set(_hf_to_own(tensors, self.cfg.num_layers))
        if missing:
            raise ModelLoadError(f"weights missing from the checkpoint: {sorted(missing)[:5]}")


def _get(tensors: Mapping[str, torch.Tensor], name: str) -> torch.Tensor | None:
    """One tensor by its HF name, accepting the old TF-era ``gamma``/``beta`` spelling."""
    if name in tensors:
        return tensors[name]
    legacy = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
        "LayerNorm.bias", "LayerNorm.beta"
    )
    return tensors.get(legacy)


def _hf_to_own(tensors: Mapping[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """HF names -> this module's names; fuses q/k/v. Absent tensors are left out."""
    pairs = {
        "word_embeddings.weight": "embeddings.word_embeddings.weight",
        "position_embeddings.weight": "embeddings.position_embeddings.weight",
        "token_type_embeddings.weight": "embeddings.token_type_embeddings.weight",
        "embed_norm.weight": "embeddings.LayerNorm.weight",
        "embed_norm.bias": "embeddings.LayerNorm.bias",
    }
    per_layer = {
        "attn_out": "attention.output.dense",
        "attn_norm": "attention.output.LayerNorm",
        "mlp_in": "intermediate.dense",
        "mlp_out": "output.dense",
        "mlp_norm": "output.LayerNorm",
    }
    for i in range(num_layers):
        for own, hf in per_layer.items():
            for kind in ("weight", "bias"):
                pairs[f"layers.{i}.{own}.{kind}"] = f"encoder.layer.{i}.{hf}.{kind}"
    out = {own: t for own, hf in pairs.items() if (t := _get(tensors, hf)) is not None}
    for i in range(num_layers):
        for kind in ("weight", "bias"):
            parts = [
                _get(tensors, f"encoder.layer.{i}.attention.self.{p}.{kind}")
                for p in ("query", "key", "value")
            ]
            if all(p is not None for p in parts):
                out[f"layers.{i}.qkv.{kind}"] = torch.cat(parts, dim=0)  # [3H, H] / [3H]
    return out
