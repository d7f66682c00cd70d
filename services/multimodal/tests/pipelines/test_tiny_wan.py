"""The embedded tiny Wan: a deterministic, cached, race-safe build of the real modules."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from jacana_multimodal.pipelines import tiny_wan
from jacana_multimodal.pipelines.tiny_wan import ensure_tiny_wan, train_tokenizer


def _weights(model_dir):
    return {
        f"{path.parent.name}/{name}": tensor
        for path in sorted(model_dir.rglob("*.safetensors"))
        for name, tensor in load_file(path).items()
    }


def test_build_is_the_real_wan_layout(tiny_t2v_dir, tiny_i2v_dir):
    index = json.loads((tiny_t2v_dir / "model_index.json").read_text())
    assert index["_class_name"] == "WanPipeline"
    assert index["transformer"] == ["diffusers", "WanTransformer3DModel"]
    assert index["vae"] == ["diffusers", "AutoencoderKLWan"]
    assert index["text_encoder"] == ["transformers", "UMT5EncoderModel"]
    assert index["scheduler"] == ["diffusers", "UniPCMultistepScheduler"]
    scheduler = json.loads((tiny_t2v_dir / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["prediction_type"] == "flow_prediction"
    assert scheduler["use_flow_sigmas"] is True and scheduler["flow_shift"] == 3.0
    i2v = json.loads((tiny_i2v_dir / "model_index.json").read_text())
    assert i2v["_class_name"] == "WanImageToVideoPipeline"
    assert i2v["image_encoder"] == ["transformers", "CLIPVisionModel"]


def test_model_card_says_the_weights_are_random(tiny_t2v_dir):
    card = (tiny_t2v_dir / "README.md").read_text()
    assert "weights are random" in card and "frames are noise" in card


def test_two_builds_are_identical(tmp_path, tiny_t2v_dir):
    again = ensure_tiny_wan(tmp_path)
    assert again.name == tiny_t2v_dir.name and again != tiny_t2v_dir
    first, second = _weights(tiny_t2v_dir), _weights(again)
    assert first.keys() == second.keys() and len(first) > 20
    for name, tensor in first.items():
        assert torch.equal(tensor, second[name]), name
    for name in ("tokenizer/tokenizer.json", "transformer/config.json", "vae/config.json"):
        assert (tiny_t2v_dir / name).read_bytes() == (again / name).read_bytes(), name


def test_build_leaves_the_global_rng_alone(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    ensure_tiny_wan(tmp_path)
    assert torch.equal(torch.rand(4), expected)


def test_second_call_returns_the_cached_directory(wan_cache, tiny_t2v_dir):
    marker = tiny_t2v_dir / "transformer" / "diffusion_pytorch_model.safetensors"
    before = marker.stat()
    assert ensure_tiny_wan(wan_cache) == tiny_t2v_dir
    after = marker.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_losing_the_rename_race_keeps_the_winners_build(tmp_path, monkeypatch):
    """Another process finishes first while this one is still building: this one's rename
    fails, its copy is discarded, and both get the same complete directory."""
    real_build = tiny_wan.build_tiny_wan
    winner = []

    def build_then_lose(out_dir, **kwargs):
        real_build(out_dir, **kwargs)
        monkeypatch.setattr(tiny_wan, "build_tiny_wan", real_build)
        winner.append(ensure_tiny_wan(tmp_path))  # the other process, finishing first

    monkeypatch.setattr(tiny_wan, "build_tiny_wan", build_then_lose)
    path = ensure_tiny_wan(tmp_path)
    assert winner == [path]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no staging left behind
    assert (path / "model_index.json").is_file()


def test_tokenizer_is_t5_style():
    tok = train_tokenizer()
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    assert tok.tokenize("A red fox") == ["▁a", "▁red", "▁fox"]
    ids = tok("Zebras jump over 3 quiet lakes!")["input_ids"]
    assert ids[-1] == tok.eos_token_id and tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == "zebras jump over 3 quiet lakes!"
    padded = tok("a cat", padding="max_length", max_length=8)["input_ids"]
    assert len(padded) == 8 and padded[-1] == tok.pad_token_id


def test_tokenizer_training_is_deterministic():
    # Rust hash maps are seeded afresh per map: a trainer that leaned on their order would
    # give a different vocabulary within a few runs.
    first = train_tokenizer().backend_tokenizer.to_str()
    for _ in range(5):
        assert train_tokenizer().backend_tokenizer.to_str() == first
