"""Where do the engine's numbers first part from transformers' on SmolLM2 (GPU, bf16)?

``services/engine/tests/test_gpu_engine.py`` finds SmolLM2's prompts 0 and 7 outside
transformers' run-to-run set: at one step transformers' top two logits tie exactly and the
engine's do not. Here both generate greedily, one prompt at a time, while every layer's
intermediate tensors are recorded at every forward (transformers through module hooks,
the engine through wrappers on its layers' methods): the layer input, the input norm, the
fused QKV product, the attention output, o_proj, the residual after attention, the
post-attention norm, gate_up, the activation, down_proj, the final norm and the logits.
Up to the step where the continuations part, both saw the same tokens, so each pair of
tensors should be equal bit for bit. Per prompt the report gives the first recorded
tensor that is not, and per kind of tensor how often it is the *origin* of a difference:
unequal while every tensor it is computed from is equal (for attention: this forward's
QKV and every earlier forward's QKV of the layer, which filled the KV cache).

Usage (GPU machine, the GGUF in ``$JACANA_SMOLLM2_GGUF``):
    python bench/hf_trace_parity_gpu.py [--out DIR] [--prompts 0,7] [--modes eager,...]
    python bench/hf_trace_parity_gpu.py --model random-qwen3 --prompts 0,1,2,3
(the parity test's random Qwen3 and its four random prompts; no files needed)
Modes: the engine run eagerly (graphs would hide the layers) with cuBLAS GEMMs on the
Triton attention ("eager") or on the torch attention backend ("eager-torch-attention").
Writes ``hf_trace_parity_MODEL.json``, and ``hf_trace_sites_MODEL.pt``: each origin of the
"eager" mode with its inputs and both outputs, to replay (``flash_numerics_probe_gpu.py
--sites``). Reuses the parity test's helpers.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from fused_projections_parity_gpu import first_difference, parity_test_module

# Per layer, the recorded tensors in dataflow order, each with the ones it is computed
# from ("prev:" = the previous layer's; "cache" = every earlier forward's rotated keys and
# values here). q_rot/k_rot: the rotated queries and new keys, attention's inputs.
LAYER_INPUTS = {
    "resid_in": ["prev:down", "prev:resid_mid"],
    "in_norm": ["resid_in"],
    "qkv": ["in_norm"],
    "q_rot": ["qkv"],
    "k_rot": ["qkv"],
    "attn": ["q_rot", "k_rot", "qkv", "cache"],
    "o": ["attn"],
    "resid_mid": ["o", "resid_in"],
    "post_norm": ["resid_mid"],
    "gate_up": ["post_norm"],
    "act": ["gate_up"],
    "down": ["act"],
}
FINAL_INPUTS = {
    "final_resid": ["last:down", "last:resid_mid"],
    "final_norm": ["final_resid"],
    "logits": ["final_norm"],
}


class Recorder:
    """Tensors recorded per forward: ``forwards[f][(layer, name)]`` ([T, ...] clones;
    layer -1 for the final ones). A forward begins at layer 0's first record."""

    def __init__(self) -> None:
        self.forwards: list[dict[tuple[int, str], torch.Tensor]] = []

    def put(self, layer: int, name: str, t: torch.Tensor) -> None:
        if layer == 0 and name in ("resid_in", "in_norm") and not self._open(layer, name):
            self.forwards.append({})
        self.forwards[-1][(layer, name)] = t.detach().reshape(-1, t.shape[-1]).clone()

    def _open(self, layer: int, name: str) -> bool:
        return bool(self.forwards) and (layer, name) not in self.forwards[-1]


def hook_transformers(model, rec: Recorder) -> list[Any]:
    handles = []

    def out_hook(layer, name):
        def hook(_m, _args, out):
            rec.put(layer, name, out[0] if isinstance(out, tuple) else out)

        return hook

    def in_hook(layer, name):
        return lambda _m, args, kwargs: rec.put(
            layer, name, args[0] if args else kwargs["hidden_states"]
        )

    def put_cat(layer, name, parts, count):
        # q/k/v (gate/up) outputs arrive one by one; record their concatenation
        def hook(_m, _args, out):
            parts.append(out)
            if len(parts) == count:
                rec.put(layer, name, torch.cat(parts, dim=-1))
                parts.clear()

        return hook

    handles.append(record_attention_inputs(model, rec))
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        handles.append(layer.register_forward_pre_hook(in_hook(i, "resid_in"), with_kwargs=True))
        handles.append(layer.input_layernorm.register_forward_hook(out_hook(i, "in_norm")))
        qkv: list[torch.Tensor] = []
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
            handles.append(proj.register_forward_hook(put_cat(i, "qkv", qkv, 3)))
        handles.append(attn.o_proj.register_forward_pre_hook(in_hook(i, "attn"), with_kwargs=True))
        handles.append(attn.o_proj.register_forward_hook(out_hook(i, "o")))
        norm = layer.post_attention_layernorm
        handles.append(norm.register_forward_pre_hook(in_hook(i, "resid_mid"), with_kwargs=True))
        handles.append(norm.register_forward_hook(out_hook(i, "post_norm")))
        gate_up: list[torch.Tensor] = []
        for proj in (mlp.gate_proj, mlp.up_proj):
            handles.append(proj.register_forward_hook(put_cat(i, "gate_up", gate_up, 2)))
        handles.append(mlp.down_proj.register_forward_pre_hook(in_hook(i, "act"), with_kwargs=True))
        handles.append(mlp.down_proj.register_forward_hook(out_hook(i, "down")))
    norm = model.model.norm
    handles.append(norm.register_forward_pre_hook(in_hook(-1, "final_resid"), with_kwargs=True))
    handles.append(norm.register_forward_hook(out_hook(-1, "final_norm")))
    handles.append(model.lm_head.register_forward_hook(out_hook(-1, "logits")))
    return handles


class _Restore:
    """A handle whose ``remove`` runs a function (to undo a patch with the hooks)."""

    def __init__(self, undo) -> None:
        self.remove = undo


def record_attention_inputs(model, rec: Recorder) -> _Restore:
    """Wrap transformers' attention function (looked up per call) so that each layer
    records its rotated queries and the keys it appended: q [1, H, T, D], k [1, Hkv, S, D]
    after the cache update, recorded as [T, H * D] and [T, Hkv * D]."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = model.config._attn_implementation
    inner = ALL_ATTENTION_FUNCTIONS[name]
    had_local = name in ALL_ATTENTION_FUNCTIONS._local_mapping

    def recorded(module, query, key, value, *args, **kwargs):
        t = query.shape[2]
        rec.put(module.layer_idx, "q_rot", query[0].transpose(0, 1))
        rec.put(module.layer_idx, "k_rot", key[0, :, -t:].transpose(0, 1))
        return inner(module, query, key, value, *args, **kwargs)

    ALL_ATTENTION_FUNCTIONS[name] = recorded

    def undo() -> None:
        if had_local:
            ALL_ATTENTION_FUNCTIONS[name] = inner
        else:
            del ALL_ATTENTION_FUNCTIONS[name]

    return _Restore(undo)


def hook_engine(model, rec: Recorder) -> None:
    """Wrap the engine model's layer methods (cuBLAS GEMMs, eager: the plain paths of
    ``RMSNorm.then``/``between``) so that they record as they run."""

    def wrap_add_norm(norm, layer, normed_name, resid_name):
        add_forward, forward = norm.add_forward, norm.forward

        def recorded_add_forward(x, residual):
            h, residual = add_forward(x, residual)
            rec.put(layer, resid_name, residual)
            rec.put(layer, normed_name, h)
            return h, residual

        def recorded_forward(x):  # layer 0's input norm: no residual yet
            rec.put(layer, resid_name, x)
            h = forward(x)
            rec.put(layer, normed_name, h)
            return h

        norm.add_forward, norm.forward = recorded_add_forward, recorded_forward

    def wrap_out(module, layer, name, input_name=None):
        def hook(_m, args, out):
            if input_name:
                rec.put(layer, input_name, args[0])
            rec.put(layer, name, out)

        module.register_forward_hook(hook)

    def wrap_attend_heads(attn, layer):
        # the rotation the step's kernels apply (the rope kernel; a decode step folds the
        # same arithmetic into attention), recomputed on copies for the record
        attend_heads = attn.attend_heads

        def recorded(qkv, rope_tables, kv_cache, meta):
            t = qkv.shape[0]
            q, k, _ = attn.qkv_proj.split(qkv)
            q = q.reshape(t, attn.n_heads, attn.head_dim).clone()
            k = k.reshape(t, attn.n_kv_heads, attn.head_dim).clone()
            q_w = attn.q_norm.weight if attn.qk_norm else None
            k_w = attn.k_norm.weight if attn.qk_norm else None
            q, k = attn.ops.rotate(q, k, rope_tables, q_w, k_w, attn.eps)
            rec.put(layer, "q_rot", q)
            rec.put(layer, "k_rot", k)
            return attend_heads(qkv, rope_tables, kv_cache, meta)

        attn.attend_heads = recorded

    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        wrap_attend_heads(attn, i)
        wrap_add_norm(layer.input_layernorm, i, "in_norm", "resid_in")
        wrap_add_norm(layer.post_attention_layernorm, i, "post_norm", "resid_mid")
        wrap_out(attn.qkv_proj, i, "qkv")
        wrap_out(attn.o_proj, i, "o", input_name="attn")
        wrap_out(mlp.gate_up_proj, i, "gate_up")
        down = mlp.down_proj

        def gated_forward(gate_up, silu_and_mul, _i=i, _orig=down.gated_forward):
            def recorded_silu(x):
                act = silu_and_mul(x)
                rec.put(_i, "act", act)
                return act

            out = _orig(gate_up, recorded_silu)
            rec.put(_i, "down", out)
            return out

        down.gated_forward = gated_forward
    wrap_add_norm(model.model.norm, -1, "final_norm", "final_resid")
    logits_in_model_dtype = model.logits_in_model_dtype

    def recorded_logits(hidden):
        out = logits_in_model_dtype(hidden)
        rec.put(-1, "logits", out)
        return out

    model.logits_in_model_dtype = recorded_logits


def differing(a: torch.Tensor | None, b: torch.Tensor | None) -> dict | None:
    """None when equal bit for bit (on the rows both hold: the last ones), else counts."""
    if a is None or b is None:
        return {"missing": "ours" if a is None else "transformers"}
    rows = min(a.shape[0], b.shape[0])
    a, b = a[-rows:], b[-rows:]
    if a.shape != b.shape:
        return {"shapes": [list(a.shape), list(b.shape)]}
    ne = a.view(torch.int16) != b.view(torch.int16) if a.dtype == torch.bfloat16 else a != b
    n = int(ne.sum())
    if n == 0:
        return None
    diff = (a.float() - b.float()).abs()
    return {"elements": n, "of": a.numel(), "max_abs": float(diff.max())}


def trace_report(ours: Recorder, theirs: Recorder, forwards: int, layers: int) -> dict:
    """First difference and origin counts over the first ``forwards`` forwards."""
    first, origins, seen = None, Counter(), []
    cache_clean = [True] * layers
    order = [(i, n) for i in range(layers) for n in LAYER_INPUTS] + [(-1, n) for n in FINAL_INPUTS]
    for f in range(forwards):
        a, b = ours.forwards[f], theirs.forwards[f]
        equal: dict[tuple[int, str], bool] = {}
        for layer, name in order:
            d = differing(a.get((layer, name)), b.get((layer, name)))
            equal[(layer, name)] = d is None
            if d is None:
                continue
            if first is None:
                first = {"forward": f, "layer": layer, "tensor": name, **d}
            inputs = (LAYER_INPUTS if layer >= 0 else FINAL_INPUTS)[name]
            upstream = []
            for src in inputs:
                if src == "cache":
                    upstream.append(cache_clean[layer])
                elif src.startswith("prev:"):
                    upstream.append(layer == 0 or equal.get((layer - 1, src[5:]), False))
                elif src.startswith("last:"):
                    upstream.append(equal.get((layers - 1, src[5:]), False))
                else:
                    upstream.append(equal.get((layer, src), False))
            if all(upstream):
                origins[name] += 1
                seen.append({"forward": f, "layer": layer, "tensor": name, **d})
        for i in range(layers):
            cache_clean[i] = cache_clean[i] and equal[(i, "k_rot")] and equal[(i, "qkv")]
    return {"first": first, "origins": dict(origins), "origin_sites": seen[:40]}


NORMS = ("in_norm", "post_norm", "final_norm")  # each computed from one recorded tensor


def site_tensors(ours: Recorder, theirs: Recorder, site: dict, hf) -> dict | None:
    """An origin's inputs (transformers', equal to ours there) and both outputs, on the
    host, to replay it: attention's q [1, H, T, D] and k, v [1, Hkv, S, D] (the layer's
    keys and values over forwards 0..f); a norm's input rows [T, hidden], weight and eps."""
    f, layer, name = site["forward"], site["layer"], site["tensor"]
    cfg = hf.config
    h, h_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // h
    out = {"site": site, "theirs": theirs.forwards[f][(layer, name)].cpu()}
    out["ours"] = ours.forwards[f][(layer, name)].cpu()
    if name == "attn":
        q = theirs.forwards[f][(layer, "q_rot")].view(-1, h, d)  # [T, H, D]
        k = torch.cat([theirs.forwards[g][(layer, "k_rot")] for g in range(f + 1)])
        v = torch.cat(
            [theirs.forwards[g][(layer, "qkv")][:, (h + h_kv) * d :] for g in range(f + 1)]
        )
        out["q"] = q.transpose(0, 1).unsqueeze(0).cpu()
        out["k"] = k.view(-1, h_kv, d).transpose(0, 1).unsqueeze(0).cpu()
        out["v"] = v.view(-1, h_kv, d).transpose(0, 1).unsqueeze(0).cpu()
        return out
    if name in NORMS:
        module = (
            hf.model.norm
            if layer < 0
            else getattr(
                hf.model.layers[layer],
                "input_layernorm" if name == "in_norm" else "post_attention_layernorm",
            )
        )
        [source] = (LAYER_INPUTS if layer >= 0 else FINAL_INPUTS)[name]
        out["x"] = theirs.forwards[f][(layer, source)].cpu()
        out["weight"] = module.weight.detach().cpu()
        out["eps"] = float(module.variance_epsilon)
        return out
    return None


def load_model(t, name: str) -> tuple[str, str, list[list[int]], Any]:
    """(engine model path, its load format, the parity test's prompts, transformers' model
    on the CPU) for SmolLM2's GGUF or the parity test's random Qwen3."""
    if name == "random-qwen3":
        import tempfile

        from conftest import write_peaked_qwen3

        path = write_peaked_qwen3(Path(tempfile.mkdtemp(prefix="peaked-qwen3-")))
        hf = t.transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
        gen = torch.Generator().manual_seed(1)
        prompts = [torch.randint(0, 2048, (n,), generator=gen).tolist() for n in (5, 17, 64, 130)]
        return str(path), "safetensors", prompts, hf
    gguf = t._smollm2_gguf()
    if gguf is None:
        raise SystemExit("SmolLM2 GGUF not found: set JACANA_SMOLLM2_GGUF")
    tok = t.transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    prompts = [tok(p).input_ids for p in t.SMOL_PROMPTS]
    hf = t.transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16
    )
    return str(gguf), "gguf", prompts, hf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench/results")))
    parser.add_argument("--prompts", default="0,7")
    parser.add_argument("--modes", default="eager,eager-torch-attention")
    parser.add_argument("--model", choices=("smollm2", "random-qwen3"), default="smollm2")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of the script")
    args = parser.parse_args()
    t = parity_test_module()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path, load_format, prompts, hf = load_model(t, args.model)
    hf = hf.to(args.device).eval()
    chosen = [int(i) for i in args.prompts.split(",")]
    layers = len(hf.model.layers)
    theirs: dict[int, tuple[list[int], Recorder]] = {}
    for i in chosen:
        rec = Recorder()
        handles = hook_transformers(hf, rec)
        [(tokens, _)] = t.hf_greedy(hf, [prompts[i]])
        for h in handles:
            h.remove()
        theirs[i] = (tokens, rec)
    sp = t.GREEDY
    report: dict[str, Any] = {}
    sites: list[dict] = []
    for mode in args.modes.split(","):
        extra = {"attention_backend": "torch"} if mode == "eager-torch-attention" else {}
        if args.device != "cuda":
            extra["device"] = args.device
        engine = t._engine(path, load_format, eager=True, **extra)
        for i in chosen:
            rec = Recorder()
            hook_engine(engine.runner.model, rec)
            [ours] = engine.generate([prompts[i]], sp)
            tokens, hf_rec = theirs[i]
            part = first_difference(ours, tokens)
            # forward f computes token f's logits; before the parting step both saw the
            # same tokens, so forwards 0 .. part are comparable
            forwards = min(len(rec.forwards), len(hf_rec.forwards), (part or t.NEW_TOKENS - 1) + 1)
            entry = {"parts_at": part, "forwards_compared": forwards}
            entry.update(trace_report(rec, hf_rec, forwards, layers))
            report[f"{mode}/prompt{i}"] = entry
            if mode == "eager":  # the Triton kernels' origins, to replay
                for site in entry["origin_sites"]:
                    found = site_tensors(rec, hf_rec, site, hf)
                    if found is not None:
                        sites.append({"prompt": i, **found})
            # a fresh wrap each prompt: unwrap by rebuilding the methods from the class
            for module in engine.runner.model.modules():
                for attr in ("add_forward", "forward", "gated_forward", "attend_heads"):
                    module.__dict__.pop(attr, None)
                module._forward_hooks.clear()
            engine.runner.model.__dict__.pop("logits_in_model_dtype", None)
        del engine
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"hf_trace_parity_{args.model}.json").write_text(json.dumps(report, indent=1))
    torch.save(sites, args.out / f"hf_trace_sites_{args.model}.pt")
    for key, entry in report.items():
        print(key, "parts at", entry["parts_at"], "| first:", entry["first"])
        print("   origins:", entry["origins"])


if __name__ == "__main__":
    main()
