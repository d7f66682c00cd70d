"""The embedded default models: Wan 2.1 at toy width with random weights.

``ensure_tiny_wan(cache_dir)`` returns a diffusers Wan directory (``WanPipeline`` layout, or
``WanImageToVideoPipeline`` with ``image_to_video=True``) holding the real Wan 2.1
modules -- ``WanTransformer3DModel``, ``AutoencoderKLWan``, transformers' ``UMT5EncoderModel``
and, for image-to-video, ``CLIPVisionModel`` -- configured a few dozen channels wide, with
weights drawn from a fixed seed. The tokenizer is a small BPE trained here on
``tiny_corpus.txt`` (package data), so nothing is downloaded. The frames such a model
renders are noise; it exists so that the whole service runs, on a CPU, in tests and demos.

State: only the cache directory. A build is written under a temporary name beside its
final one and renamed into place, so a reader either finds a complete directory or none,
and two processes building at once both end up with the same complete directory (the
loser of the rename discards its copy). The directory name carries a digest of the recipe
(configs, seed, corpus), so a changed recipe builds afresh instead of reusing stale weights.

Build: a fraction of a second on a CPU; the saved weights are a few hundred kilobytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from importlib import resources
from pathlib import Path

import torch
from diffusers import (
    AutoencoderKLWan,
    UniPCMultistepScheduler,
    WanImageToVideoPipeline,
    WanPipeline,
    WanTransformer3DModel,
)
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    CLIPVisionModel,
    PreTrainedTokenizerFast,
    UMT5Config,
    UMT5EncoderModel,
)

SEED = 20250301
TEXT_MAX_LENGTH = 512  # what WanPipeline pads prompts to (its max_sequence_length default)

# Special tokens in T5's order: pad 0 (UMT5's pad and decoder start), eos 1, unk 2.
_PAD, _EOS, _UNK = "<pad>", "</s>", "<unk>"
_VOCAB_SIZE = 1024

# The module configs. Spatial sizes must be multiples of 16: the VAE downsamples by
# 2 ** len(temperal_downsample) = 8 and the transformer patches 2x2. Time compresses by 4
# (two True entries), as in the real Wan VAE, so clips have 4k + 1 frames.
_Z_DIM = 4
_TRANSFORMER = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=12,
    in_channels=_Z_DIM,
    out_channels=_Z_DIM,
    text_dim=32,
    freq_dim=256,
    ffn_dim=32,
    num_layers=2,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=32,
)
# Image-to-video conditions the transformer on [noise | first-frame mask | first-frame
# latents] along channels (mask: one channel per frame of a 4-frame temporal group) and
# cross-attends to CLIP image features through extra K/V projections of width inner_dim.
_CLIP_HIDDEN = 16
_I2V_TRANSFORMER = dict(
    _TRANSFORMER,
    in_channels=_Z_DIM + 4 + _Z_DIM,
    image_dim=_CLIP_HIDDEN,
    added_kv_proj_dim=_TRANSFORMER["num_attention_heads"] * _TRANSFORMER["attention_head_dim"],
)
_VAE = dict(
    base_dim=8,
    z_dim=_Z_DIM,
    dim_mult=[1, 1, 1, 1],
    num_res_blocks=1,
    temperal_downsample=[False, True, True],  # diffusers spells it so
    latents_mean=[0.0] * _Z_DIM,
    latents_std=[1.0] * _Z_DIM,
)
_TEXT_ENCODER = dict(
    d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8
)
_CLIP = dict(
    hidden_size=_CLIP_HIDDEN,
    projection_dim=_CLIP_HIDDEN,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=32,
    patch_size=4,
)
_SCHEDULER = dict(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)

# The weights are drawn from torch's process-global RNG (module constructors take no
# generator), so builds in two threads of one process must not interleave.
_RNG_LOCK = threading.Lock()

MODEL_CARD = """\
# Tiny random Wan 2.1 {task}

The Wan 2.1 {task} architecture (diffusers layout) at toy width: a {layers}-layer
transformer {width} channels wide, a {z}-channel VAE and a {te}-wide UMT5 text encoder.

**Its weights are random** (drawn from seed {seed}) and **its frames are noise.** It is not
a video model in any useful sense: it exists so that Jacana's video service, its job
queue and its encoders run end to end on a CPU, in tests and demos, without downloading
anything. The tokenizer is a BPE trained on a few hundred English sentences that
ship with the package.

Built by `jacana_multimodal.pipelines.tiny_wan`; the directory name carries a digest of the
recipe.
"""


def _corpus() -> list[str]:
    text = resources.files("jacana_multimodal.pipelines").joinpath("tiny_corpus.txt")
    return [line for line in text.read_text(encoding="utf-8").splitlines() if line.strip()]


def recipe_digest(*, image_to_video: bool = False) -> str:
    """12 hex digits naming everything that determines a build's bytes."""
    recipe = {
        "seed": SEED,
        "transformer": _I2V_TRANSFORMER if image_to_video else _TRANSFORMER,
        "vae": _VAE,
        "text_encoder": _TEXT_ENCODER,
        "clip": _CLIP if image_to_video else None,
        "scheduler": _SCHEDULER,
        "tokenizer": ("bpe", "metaspace", "nfkc-lower", _VOCAB_SIZE),
        "corpus": _corpus(),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def train_tokenizer() -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE (lower-cased, ``▁`` marks a word start, as T5's own
    tokenizer does) trained on the packaged corpus, wrapped for transformers.

    The alphabet is seeded with printable ASCII, so any ASCII prompt encodes without
    ``<unk>``. Encodings end in ``</s>`` as T5's do (WanPipeline tokenizes with special
    tokens on). BPE training is deterministic (merge ties break by pair, the alphabet is
    sorted); tokenizers' WordPiece trainer is not (its vocabulary order varies between
    processes), which is why this is BPE.
    """
    tok = Tokenizer(models.BPE(unk_token=_UNK))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE,
        special_tokens=[_PAD, _EOS, _UNK],
        initial_alphabet=[chr(c) for c in range(0x20, 0x7F)],
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {_EOS}", special_tokens=[(_EOS, tok.token_to_id(_EOS))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=_PAD,
        eos_token=_EOS,
        unk_token=_UNK,
        model_max_length=TEXT_MAX_LENGTH,
    )


def build_tiny_wan(out_dir: Path, *, image_to_video: bool = False) -> None:
    """Build the tiny pipeline and ``save_pretrained`` it (float32) into ``out_dir``.

    The global torch RNG is left as it was: the weights come from a forked generator state.
    """
    tokenizer = train_tokenizer()
    with _RNG_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        # Construction order fixes which random numbers each module draws.
        text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), **_TEXT_ENCODER))
        vae = AutoencoderKLWan(**_VAE)
        components = dict(
            tokenizer=tokenizer,
            text_encoder=text_encoder,
            vae=vae,
            scheduler=UniPCMultistepScheduler(**_SCHEDULER),
        )
        if image_to_video:
            components["transformer"] = WanTransformer3DModel(**_I2V_TRANSFORMER)
            components["image_encoder"] = CLIPVisionModel(CLIPVisionConfig(**_CLIP))
            side = _CLIP["image_size"]
            components["image_processor"] = CLIPImageProcessorPil(
                size={"shortest_edge": side}, crop_size={"height": side, "width": side}
            )
            pipeline = WanImageToVideoPipeline(**components)
        else:
            components["transformer"] = WanTransformer3DModel(**_TRANSFORMER)
            pipeline = WanPipeline(**components)
    pipeline.save_pretrained(out_dir)
    card = MODEL_CARD.format(
        task="image-to-video" if image_to_video else "text-to-video",
        layers=_TRANSFORMER["num_layers"],
        width=_TRANSFORMER["num_attention_heads"] * _TRANSFORMER["attention_head_dim"],
        z=_Z_DIM,
        te=_TEXT_ENCODER["d_model"],
        seed=SEED,
    )
    (out_dir / "README.md").write_text(card, encoding="utf-8")


def ensure_tiny_wan(cache_dir: Path, *, image_to_video: bool = False) -> Path:
    """The tiny model's directory under ``cache_dir``, built on first use.

    Safe to call from several processes at once: each builds into its own temporary
    directory and renames it into place; a rename that finds the directory already there
    discards its own copy.
    """
    task = "i2v" if image_to_video else "t2v"
    final = Path(cache_dir) / f"wan2.1-{task}-tiny-{recipe_digest(image_to_video=image_to_video)}"
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        build_tiny_wan(staging, image_to_video=image_to_video)
        os.rename(staging, final)
    except OSError:
        # Another process renamed its build into place first (ENOTEMPTY/EEXIST); any other
        # failure leaves ``final`` absent and is re-raised.
        if not final.is_dir():
            raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return final
