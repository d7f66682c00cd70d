"""Whisper's encoder and decoder in torch, built from a CTranslate2 ``WhisperSpec`` checkpoint.

Owns the model weights (float32 by default, on the device given at build time) and the
per-window decoder state (``DecoderCache``: self-attention keys/values grown one step at a
time, cross-attention keys/values computed once from the encoder output). Decoding policy
(which token to pick, logit rules) lives in window_decoder.py; token ids in whisper_tokens.py.

CTranslate2 layout (per layer ``i``; ``linear_k`` holds ``weight`` [out, in] and ``bias``):
  encoder/conv{1,2}                       Conv1d, kernel 3, padding 1, strides 1 and 2, GELU
  encoder/position_encodings/encodings    [1500, d_model] sinusoids (optional: computed)
  encoder/layer_i/self_attention          layer_norm, linear_0 = fused QKV, linear_1 = out
  encoder/layer_i/ffn                     layer_norm, linear_0 (d -> 4d), GELU, linear_1
  decoder/embeddings/weight               [vocab, d_model]; decoder/projection aliases it
  decoder/position_encodings/encodings    [448, d_model] learned
  decoder/layer_i/self_attention          as in the encoder, causal
  decoder/layer_i/attention               layer_norm, linear_0 = Q, linear_1 = fused KV, linear_2
  {encoder,decoder}/layer_norm            final LayerNorm (eps 1e-5)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from jacana_asr.ct2_checkpoint import CheckpointError, CT2Checkpoint

LAYER_NORM_EPS = 1e-5


@dataclass(frozen=True)
class WhisperConfig:
    """Shapes of one Whisper model, read from its checkpoint.

    n_audio_ctx: encoder positions (1500 = 3000 mel frames / conv stride 2).
    n_text_ctx: decoder positions (448): the most tokens one window's decoding can hold.
    alignment_heads: (decoder layer, head) pairs whose cross-attention follows the timing
      of the speech (word timestamps). From config.json's ``alignment_heads`` (CTranslate2's
      converter copies them from the model's generation config, i.e. openai-whisper's list
      per model); a checkpoint without them gets every head of the last half of the decoder
      layers, the converter's and openai-whisper's default.
    """

    n_mels: int
    d_model: int
    n_encoder_layers: int
    n_encoder_heads: int
    n_decoder_layers: int
    n_decoder_heads: int
    n_vocab: int
    n_audio_ctx: int
    n_text_ctx: int
    alignment_heads: tuple[tuple[int, int], ...] = ()

    @property
    def n_frames(self) -> int:
        """Mel frames in one window (the encoder's input length)."""
        return 2 * self.n_audio_ctx

    @classmethod
    def from_checkpoint(cls, ckpt: CT2Checkpoint) -> WhisperConfig:
        if ckpt.spec != "WhisperSpec":
            raise CheckpointError(f"{ckpt.path}: spec {ckpt.spec!r} is not WhisperSpec")
        conv1 = ckpt.variables["encoder/conv1/weight"]  # [d_model, n_mels, 3]
        embeddings = ckpt.variables["decoder/embeddings/weight"]  # [vocab, d_model]
        enc_pos = "encoder/position_encodings/encodings"
        n_decoder_layers = _count_layers(ckpt, "decoder")
        n_decoder_heads = int(ckpt.scalar("decoder/num_heads"))
        return cls(
            n_mels=conv1.shape[1],
            d_model=conv1.shape[0],
            n_encoder_layers=_count_layers(ckpt, "encoder"),
            n_encoder_heads=int(ckpt.scalar("encoder/num_heads")),
            n_decoder_layers=n_decoder_layers,
            n_decoder_heads=n_decoder_heads,
            n_vocab=embeddings.shape[0],
            n_audio_ctx=ckpt.variables[enc_pos].shape[0] if ckpt.has(enc_pos) else 1500,
            n_text_ctx=ckpt.variables["decoder/position_encodings/encodings"].shape[0],
            alignment_heads=_alignment_heads(ckpt, n_decoder_layers, n_decoder_heads),
        )


def _alignment_heads(
    ckpt: CT2Checkpoint, n_layers: int, n_heads: int
) -> tuple[tuple[int, int], ...]:
    listed = ckpt.config.get("alignment_heads")
    if not listed:
        last_half = range(n_layers // 2, n_layers)
        return tuple((layer, head) for layer in last_half for head in range(n_heads))
    heads = tuple((int(layer), int(head)) for layer, head in listed)
    for layer, head in heads:
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise CheckpointError(
                f"{ckpt.path}: alignment head ({layer}, {head}) is outside the decoder's "
                f"{n_layers} layers x {n_heads} heads"
            )
    return heads


def _count_layers(ckpt: CT2Checkpoint, scope: str) -> int:
    n = 0
    while ckpt.has(f"{scope}/layer_{n}/ffn/linear_0/weight"):
        n += 1
    if n == 0:
        raise CheckpointError(f"{ckpt.path}: no {scope} layers")
    return n


def sinusoids(length: int, channels: int, max_timescale: float = 10_000.0) -> torch.Tensor:
    """Whisper's encoder positions: [length, channels] = [sin(t * f) | cos(t * f)]."""
    log_increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-log_increment * torch.arange(channels // 2, dtype=torch.float64))
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_timescales[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1).to(torch.float32)


class _Loader:
    """Hands out checkpoint tensors as float parameters on one device and dtype."""

    def __init__(self, ckpt: CT2Checkpoint, device: torch.device, dtype: torch.dtype) -> None:
        self.ckpt, self.device, self.dtype = ckpt, device, dtype

    def tensor(self, name: str) -> torch.Tensor:
        return self.ckpt.float_tensor(name, self.dtype).to(self.device)

    def linear(self, scope: str) -> nn.Linear:
        weight = self.tensor(f"{scope}/weight")  # [out, in]
        has_bias = self.ckpt.has(f"{scope}/bias")
        layer = nn.Linear(weight.shape[1], weight.shape[0], bias=has_bias)
        layer.weight = nn.Parameter(weight, requires_grad=False)
        if has_bias:
            layer.bias = nn.Parameter(self.tensor(f"{scope}/bias"), requires_grad=False)
        return layer

    def layer_norm(self, scope: str) -> nn.LayerNorm:
        gamma = self.tensor(f"{scope}/gamma")
        norm = nn.LayerNorm(gamma.shape[0], eps=LAYER_NORM_EPS)
        norm.weight = nn.Parameter(gamma, requires_grad=False)
        norm.bias = nn.Parameter(self.tensor(f"{scope}/beta"), requires_grad=False)
        return norm

    def conv1d(self, scope: str, stride: int) -> nn.Conv1d:
        weight = self.tensor(f"{scope}/weight")  # [out, in, kernel]
        conv = nn.Conv1d(weight.shape[1], weight.shape[0], weight.shape[2], stride, padding=1)
        conv.weight = nn.Parameter(weight, requires_grad=False)
        conv.bias = nn.Parameter(self.tensor(f"{scope}/bias"), requires_grad=False)
        return conv


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal_offset: int | None):
    """Scaled dot-product attention (softmax(q k^T / sqrt(head_dim)) v).

    q: [batch, heads, q_len, head_dim]; k, v: [batch, heads, kv_len, head_dim].
    causal_offset: position of q's first row within k (None: attend to every key).
    Returns [batch, heads, q_len, head_dim].
    """
    mask = None
    if causal_offset is not None and q.shape[2] > 1:
        q_pos = torch.arange(q.shape[2], device=q.device)[:, None] + causal_offset
        k_pos = torch.arange(k.shape[2], device=q.device)[None, :]
        mask = k_pos <= q_pos  # [q_len, kv_len], True = may attend
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    # x: [batch, time, d_model] -> [batch, heads, time, head_dim]
    batch, time, d_model = x.shape
    return x.view(batch, time, n_heads, d_model // n_heads).transpose(1, 2)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    # x: [batch, heads, time, head_dim] -> [batch, time, d_model]
    batch, heads, time, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, time, heads * head_dim)


class _FeedForward(nn.Module):
    def __init__(self, load: _Loader, scope: str) -> None:
        super().__init__()
        self.norm = load.layer_norm(f"{scope}/layer_norm")
        self.up = load.linear(f"{scope}/linear_0")
        self.down = load.linear(f"{scope}/linear_1")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class _EncoderLayer(nn.Module):
    def __init__(self, load: _Loader, scope: str, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm = load.layer_norm(f"{scope}/self_attention/layer_norm")
        self.qkv = load.linear(f"{scope}/self_attention/linear_0")
        self.out = load.linear(f"{scope}/self_attention/linear_1")
        self.ffn = _FeedForward(load, f"{scope}/ffn")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [batch, time, d_model]
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        heads = [_split_heads(t, self.n_heads) for t in (q, k, v)]
        x = x + self.out(_merge_heads(_attend(*heads, causal_offset=None)))
        return self.ffn(x)


class WhisperEncoder(nn.Module):
    """mel: [batch, n_mels, 2 * n_audio_ctx] -> [batch, n_audio_ctx, d_model]."""

    def __init__(self, load: _Loader, config: WhisperConfig) -> None:
        super().__init__()
        self.conv1 = load.conv1d("encoder/conv1", stride=1)
        self.conv2 = load.conv1d("encoder/conv2", stride=2)
        name = "encoder/position_encodings/encodings"
        positions = (
            load.tensor(name)
            if load.ckpt.has(name)
            else sinusoids(config.n_audio_ctx, config.d_model).to(load.device, load.dtype)
        )
        self.register_buffer("positions", positions, persistent=False)
        self.layers = nn.ModuleList(
            _EncoderLayer(load, f"encoder/layer_{i}", config.n_encoder_heads)
            for i in range(config.n_encoder_layers)
        )
        self.norm = load.layer_norm("encoder/layer_norm")

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv1(mel))  # [batch, d_model, frames]
        x = F.gelu(self.conv2(x)).transpose(1, 2)  # [batch, frames / 2, d_model]
        x = x + self.positions[: x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


@dataclass
class DecoderCache:
    """One window's decoder state for a batch of sequences (lives on the model's device).

    self_k, self_v: [layers, batch, heads, n_text_ctx, head_dim], filled up to ``length``.
    cross_k, cross_v: [layers, batch, heads, n_audio_ctx, head_dim], fixed for the window.
    """

    self_k: torch.Tensor
    self_v: torch.Tensor
    cross_k: torch.Tensor
    cross_v: torch.Tensor
    length: int = 0

    def select(self, rows: torch.Tensor) -> DecoderCache:
        """Keep only batch rows ``rows`` (e.g. the sequences still decoding)."""
        return DecoderCache(
            self.self_k[:, rows],
            self.self_v[:, rows],
            self.cross_k[:, rows],
            self.cross_v[:, rows],
            self.length,
        )


class _DecoderLayer(nn.Module):
    def __init__(self, load: _Loader, scope: str, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.self_norm = load.layer_norm(f"{scope}/self_attention/layer_norm")
        self.self_qkv = load.linear(f"{scope}/self_attention/linear_0")
        self.self_out = load.linear(f"{scope}/self_attention/linear_1")
        self.cross_norm = load.layer_norm(f"{scope}/attention/layer_norm")
        self.cross_q = load.linear(f"{scope}/attention/linear_0")
        self.cross_kv = load.linear(f"{scope}/attention/linear_1")
        self.cross_out = load.linear(f"{scope}/attention/linear_2")
        self.ffn = _FeedForward(load, f"{scope}/ffn")

    def cross_keys_values(self, audio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # audio: [batch, n_audio_ctx, d_model] -> k, v: [batch, heads, n_audio_ctx, head_dim]
        k, v = self.cross_kv(audio).chunk(2, dim=-1)
        return _split_heads(k, self.n_heads), _split_heads(v, self.n_heads)

    def forward(
        self, x: torch.Tensor, cache: DecoderCache, index: int, score_heads: Sequence[int] = ()
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: [batch, new, d_model] -> (x, the pre-softmax cross-attention scores of
        ``score_heads`` [batch, len(score_heads), new, n_audio_ctx], None without heads).
        Writes this layer's new keys/values into the cache."""
        start, end = cache.length, cache.length + x.shape[1]
        q, k, v = self.self_qkv(self.self_norm(x)).chunk(3, dim=-1)
        cache.self_k[index, :, :, start:end] = _split_heads(k, self.n_heads)
        cache.self_v[index, :, :, start:end] = _split_heads(v, self.n_heads)
        attended = _attend(
            _split_heads(q, self.n_heads),
            cache.self_k[index, :, :, :end],
            cache.self_v[index, :, :, :end],
            causal_offset=start,
        )
        x = x + self.self_out(_merge_heads(attended))
        q = _split_heads(self.cross_q(self.cross_norm(x)), self.n_heads)
        attended = _attend(q, cache.cross_k[index], cache.cross_v[index], causal_offset=None)
        x = x + self.cross_out(_merge_heads(attended))
        scores = None
        if score_heads:
            heads = list(score_heads)
            keys = cache.cross_k[index][:, heads]  # [batch, len(heads), n_audio_ctx, head_dim]
            scores = (q[:, heads] @ keys.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return self.ffn(x), scores


class WhisperDecoder(nn.Module):
    """Token ids + cache -> next-token logits; the output projection shares the embeddings."""

    def __init__(self, load: _Loader, config: WhisperConfig) -> None:
        super().__init__()
        self.config = config
        embeddings = load.tensor("decoder/embeddings/weight")  # [vocab, d_model]
        tied = (
            load.ckpt.variables["decoder/projection/weight"]
            is load.ckpt.variables["decoder/embeddings/weight"]
        )
        self.register_buffer("embeddings", embeddings, persistent=False)
        self.register_buffer(
            "projection",
            embeddings if tied else load.tensor("decoder/projection/weight"),
            persistent=False,
        )
        positions = load.tensor("decoder/position_encodings/encodings")  # [ctx, d_model]
        self.register_buffer("positions", positions, persistent=False)
        self.layers = nn.ModuleList(
            _DecoderLayer(load, f"decoder/layer_{i}", config.n_decoder_heads)
            for i in range(config.n_decoder_layers)
        )
        self.norm = load.layer_norm("decoder/layer_norm")

    def new_cache(self, audio: torch.Tensor) -> DecoderCache:
        """An empty cache for decoding against ``audio`` [batch, n_audio_ctx, d_model]."""
        cfg = self.config
        batch, head_dim = audio.shape[0], cfg.d_model // cfg.n_decoder_heads
        shape = (cfg.n_decoder_layers, batch, cfg.n_decoder_heads, cfg.n_text_ctx, head_dim)
        cross = [layer.cross_keys_values(audio) for layer in self.layers]
        return DecoderCache(
            self_k=audio.new_zeros(shape),
            self_v=audio.new_zeros(shape),
            cross_k=torch.stack([k for k, _ in cross]),
            cross_v=torch.stack([v for _, v in cross]),
        )

    def forward(self, tokens: torch.Tensor, cache: DecoderCache) -> torch.Tensor:
        """tokens: [batch, new] -> logits [batch, new, vocab]; advances cache.length by new."""
        return self.forward_with_scores(tokens, cache, ())[0]

    def forward_with_scores(
        self, tokens: torch.Tensor, cache: DecoderCache, heads: Sequence[tuple[int, int]]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``forward``, also returning the pre-softmax cross-attention scores of ``heads``
        ((layer, head) pairs), ordered by layer: [batch, len(heads), new, n_audio_ctx]."""
        start, end = cache.length, cache.length + tokens.shape[1]
        if end > self.config.n_text_ctx:
            raise ValueError(f"decoder context is {self.config.n_text_ctx} tokens; asked {end}")
        x = self.embeddings[tokens] + self.positions[start:end]  # [batch, new, d_model]
        scores: list[torch.Tensor] = []
        for index, layer in enumerate(self.layers):
            x, layer_scores = layer(x, cache, index, [h for lay, h in heads if lay == index])
            if layer_scores is not None:
                scores.append(layer_scores)
        cache.length = end
        logits = self.norm(x) @ self.projection.T
        return logits, (torch.cat(scores, dim=1) if scores else None)


class WhisperModel(nn.Module):
    """The whole model; ``encode`` once per 30 s window, then ``decode`` step by step."""

    def __init__(
        self,
        ckpt: CT2Checkpoint,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.config = WhisperConfig.from_checkpoint(ckpt)
        load = _Loader(ckpt, torch.device(device), dtype)
        self.encoder = WhisperEncoder(load, self.config)
        self.decoder = WhisperDecoder(load, self.config)
        self.device = load.device
        self.dtype = dtype

    @torch.inference_mode()
    def encode(self, mel: torch.Tensor) -> torch.Tensor:
        """mel: [batch, n_mels, n_frames] -> audio features [batch, n_audio_ctx, d_model]."""
        cfg = self.config
        if mel.dim() != 3 or mel.shape[1] != cfg.n_mels or mel.shape[2] != cfg.n_frames:
            raise ValueError(
                f"expected mel [batch, {cfg.n_mels}, {cfg.n_frames}], got {tuple(mel.shape)}"
            )
        return self.encoder(mel.to(self.device, self.dtype))

    @torch.inference_mode()
    def new_cache(self, audio: torch.Tensor) -> DecoderCache:
        return self.decoder.new_cache(audio)

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, cache: DecoderCache) -> torch.Tensor:
        """tokens: [batch, new] -> logits [batch, new, vocab] (float32)."""
        return self.decoder(tokens.to(self.device), cache).float()

    @torch.inference_mode()
    def alignment_scores(
        self, audio: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One teacher-forced pass over whole sequences, for word alignment.

        audio: encoder output [batch, n_audio_ctx, d_model]; tokens: [batch, length].
        Returns (logits [batch, length, vocab], pre-softmax cross-attention scores of the
        config's alignment heads [batch, len(alignment_heads), length, n_audio_ctx]), both
        float32.
        """
        cache = self.new_cache(audio)
        heads = self.config.alignment_heads
        logits, scores = self.decoder.forward_with_scores(tokens.to(self.device), cache, heads)
        return logits.float(), scores.float()
