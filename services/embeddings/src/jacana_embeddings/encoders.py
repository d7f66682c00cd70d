"""Registry of encoder families keyed by HF architecture name, and the weight loader.

Every supported family runs on :class:`~jacana_embeddings.bert.BertEncoder`; a family
only says how its config and checkpoint names map onto it. Adding a family is one
:class:`EncoderFamily` entry, not a new code path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from jacana_embeddings.bert import BertConfig, BertEncoder
from jacana_embeddings.errors import ModelLoadError


@dataclass(frozen=True)
class EncoderFamily:
    """How one HF architecture maps onto :class:`BertEncoder`.

    ``weight_prefixes``: checkpoint name prefixes stripped before loading (task models
    save the encoder under ``bert.`` / ``roberta.``). ``roberta_positions``: position ids
    start at ``pad_token_id + 1`` and pad tokens keep position ``pad_token_id``.
    """

    name: str
    weight_prefixes: tuple[str, ...]
    roberta_positions: bool = False

    def config(self, hf: dict) -> BertConfig:
        """``config.json`` contents -> :class:`BertConfig`; raises ModelLoadError."""
        kind = hf.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ModelLoadError(f"position_embedding_type {kind!r} is not supported")
        try:
            pad = int(hf.get("pad_token_id") or 0)
            return BertConfig(
                vocab_size=int(hf["vocab_size"]),
                hidden_size=int(hf["hidden_size"]),
                num_layers=int(hf["num_hidden_layers"]),
                num_heads=int(hf["num_attention_heads"]),
                intermediate_size=int(hf["intermediate_size"]),
                max_position_embeddings=int(hf["max_position_embeddings"]),
                type_vocab_size=int(hf.get("type_vocab_size", 2)),
                layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
                hidden_act=str(hf.get("hidden_act", "gelu")),
                pad_token_id=pad,
                position_offset=pad + 1 if self.roberta_positions else 0,
                positions_skip_pad=self.roberta_positions,
            )
        except KeyError as exc:
            raise ModelLoadError(f"config.json has no {exc.args[0]!r}") from None


_BERT = EncoderFamily("bert", weight_prefixes=("bert.",))
_ROBERTA = EncoderFamily("roberta", ("roberta.",), roberta_positions=True)
_XLM_ROBERTA = EncoderFamily("xlm-roberta", ("roberta.",), roberta_positions=True)

ENCODER_FAMILIES: dict[str, EncoderFamily] = {
    "BertModel": _BERT,
    "BertForMaskedLM": _BERT,
    "BertForPreTraining": _BERT,
    "RobertaModel": _ROBERTA,
    "RobertaForMaskedLM": _ROBERTA,
    "XLMRobertaModel": _XLM_ROBERTA,
    "XLMRobertaForMaskedLM": _XLM_ROBERTA,
}
# When config.json lists no architecture, its model_type decides.
_BY_MODEL_TYPE = {f.name: f for f in (_BERT, _ROBERTA, _XLM_ROBERTA)}


def resolve_family(hf: dict) -> tuple[str, EncoderFamily]:
    """The (architecture name, family) a ``config.json`` describes; raises ModelLoadError."""
    for arch in hf.get("architectures") or []:
        if arch in ENCODER_FAMILIES:
            return arch, ENCODER_FAMILIES[arch]
    model_type = hf.get("model_type")
    if not hf.get("architectures") and model_type in _BY_MODEL_TYPE:
        return model_type, _BY_MODEL_TYPE[model_type]
    raise ModelLoadError(
        f"unsupported encoder architecture {hf.get('architectures') or model_type!r}; "
        f"supported: {sorted(ENCODER_FAMILIES)}"
    )


def read_safetensors(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of the ``*.safetensors`` files directly inside ``model_dir`` (on CPU)."""
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors weights in {model_dir}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def load_encoder(
    model_dir: Path, dtype: torch.dtype, device: torch.device
) -> tuple[str, BertEncoder]:
    """Build the encoder of an HF model directory with its weights, in eval mode."""
    try:
        hf = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {model_dir / 'config.json'}: {exc}") from None
    arch, family = resolve_family(hf)
    encoder = BertEncoder(family.config(hf))
    tensors = read_safetensors(model_dir)
    for prefix in family.weight_prefixes:
        if any(name.startswith(prefix) for name in tensors):
            tensors = {n.removeprefix(prefix): t for n, t in tensors.items()}
    encoder.load_hf_weights(tensors)
    return arch, encoder.to(device=device, dtype=dtype).eval().requires_grad_(False)
