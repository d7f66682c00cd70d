"""Do the engine's departures from transformers on SmolLM2 (GPU, bf16) come from its fused
QKV and gate_up projections?

``services/engine/tests/test_gpu_engine.py`` finds prompts 0 and 7 outside transformers'
run-to-run set. The engine runs q/k/v as one GEMM over [q; k; v] and gate/up as one over
[gate; up], which cuBLAS may reduce in another order than transformers' separate GEMMs.
Here transformers runs as is and with its projections fused the same way (one GEMM, its
output sliced), with SDPA and with eager attention, and each is set against the engine's
greedy continuations (cuBLAS GEMMs, CUDA graphs on and off): per prompt, the first step
where two continuations differ (None: identical).

Usage (GPU machine, the GGUF in ``$JACANA_SMOLLM2_GGUF``):
    python bench/fused_projections_parity_gpu.py [--out DIR]
Writes ``fused_projections_parity.json``. Reuses the parity test's helpers.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

TESTS = Path(__file__).resolve().parents[1] / "services" / "engine" / "tests"


def parity_test_module():
    """services/engine/tests/test_gpu_engine.py, imported from its path."""
    sys.path.insert(0, str(TESTS))
    spec = importlib.util.spec_from_file_location("test_gpu_engine", TESTS / "test_gpu_engine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FusedGemm(torch.nn.Module):
    """One GEMM over a group's stacked weights [sum N_i, K]; ``run`` keeps its output's
    slices for the group's other projections, called next on the same input."""

    def __init__(self, weights: list[torch.Tensor]) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.cat(weights), requires_grad=False)
        self.sizes = [w.shape[0] for w in weights]
        self.parts: list[torch.Tensor] = []
        self.x: torch.Tensor | None = None

    def run(self, x: torch.Tensor) -> list[torch.Tensor]:
        y = F.linear(x, self.weight)
        self.parts, self.x = [p.contiguous() for p in y.split(self.sizes, dim=-1)], x
        return self.parts


class Projection(torch.nn.Module):
    """Projection ``index`` of a ``FusedGemm`` group: the first runs the GEMM."""

    def __init__(self, group: FusedGemm, index: int) -> None:
        super().__init__()
        self.group = [group]  # a list: not registered again as a submodule
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group = self.group[0]
        if self.index == 0:
            return group.run(x)[0]
        assert x is group.x, "a fused projection was called on another input"
        return group.parts[self.index]


def fuse_projections(model) -> None:
    """transformers' Llama layers with q/k/v and gate/up each run as one GEMM."""
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = FusedGemm([attn.q_proj.weight.data, attn.k_proj.weight.data, attn.v_proj.weight.data])
        attn.q_proj, attn.k_proj, attn.v_proj = (Projection(qkv, i) for i in range(3))
        gate_up = FusedGemm([mlp.gate_proj.weight.data, mlp.up_proj.weight.data])
        mlp.gate_proj, mlp.up_proj = (Projection(gate_up, i) for i in range(2))


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((j for j, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench/results")))
    args = parser.parse_args()
    t = parity_test_module()
    gguf = t._smollm2_gguf()
    if gguf is None:
        raise SystemExit("SmolLM2 GGUF not found: set JACANA_SMOLLM2_GGUF")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tok = t.transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    prompts = [tok(p).input_ids for p in t.SMOL_PROMPTS]

    def load():
        model = t.transformers.AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16
        )
        return model.cuda().eval()

    def continuations(model) -> tuple[list[list[int]], list[list[int]]]:
        """(with SDPA, with eager attention)."""
        sdpa = [tokens for tokens, _ in t.hf_greedy(model, prompts)]
        with t._attention(model, "eager"):
            eager = [tokens for tokens, _ in t.hf_greedy(model, prompts)]
        return sdpa, eager

    hf, hf_eager_attention = continuations(load())
    fused_model = load()
    fuse_projections(fused_model)
    fused, fused_eager_attention = continuations(fused_model)
    del fused_model
    sp = t.SamplingParams(temperature=0.0, max_tokens=t.NEW_TOKENS, ignore_eos=True)
    ours = {}
    for mode, eager in (("graphs", False), ("eager", True)):
        engine = t._engine(str(gguf), "gguf", eager=eager)
        ours[mode] = [engine.generate([p], sp)[0] for p in prompts]
        del engine
        torch.cuda.empty_cache()
    pairs = {
        "ours_graphs_vs_hf": (ours["graphs"], hf),
        "ours_graphs_vs_hf_fused": (ours["graphs"], fused),
        "ours_graphs_vs_hf_fused_eager_attention": (ours["graphs"], fused_eager_attention),
        "ours_eager_vs_hf_fused": (ours["eager"], fused),
        "hf_fused_vs_hf": (fused, hf),
        "hf_eager_attention_vs_hf": (hf_eager_attention, hf),
    }
    report = {
        name: [first_difference(x, y) for x, y in zip(a, b, strict=True)]
        for name, (a, b) in pairs.items()
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fused_projections_parity.json").write_text(json.dumps(report, indent=1))
    for name, steps in report.items():
        print(f"{name}: identical {steps.count(None)}/{len(steps)}, first differences {steps}")


if __name__ == "__main__":
    main()
