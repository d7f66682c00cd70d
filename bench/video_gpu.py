"""Wan 2.1 T2V 1.3B on one GPU: Jacana's render against the plain diffusers pipeline call.

The model is the real architecture with random weights, built on the GPU (nothing is
downloaded): diffusers' ``WanTransformer3DModel`` in the 1.3B shape (30 layers, 12 heads
of 128, FFN 8960, text width 4096), the default ``AutoencoderKLWan`` (Wan 2.1's VAE) and
transformers' UMT5 encoder in UMT5-XXL's shape (d_model 4096, 24 layers, 64 heads, d_ff
10240) over the embedded tiny model's tokenizer (its vocabulary is small; the encoder's
cost does not depend on it). Transformer and text encoder are bfloat16 (the transformer's
norms, time embedder and modulation tables float32, as ``from_pretrained`` leaves them),
the VAE float32: what ``WanVideoModel.load`` makes of a real checkpoint. The scheduler is
UniPC flow matching with shift 3.0, as Wan's 480p pipeline uses.

One process, one set of weights. The peers share the text encoder and the VAE; each has
its own copy of the transformer, since compiling changes it in place:

- ``diffusers``: ``WanPipeline(...)(...)`` with its defaults (PyTorch's SDPA, whose pick
  is recorded: on Hopper under torch 2.11, cuDNN's fused attention; no compilation).
- ``jacana``: ``WanVideoModel.render`` with the served setting
  (``MultimodalSettings().cuda_compile``), frames as the worker gets them (uint8).
- candidate accelerations alone, applied to plain diffusers through diffusers' own API, so
  the table says what each gives: cuDNN attention forced through diffusers' attention
  dispatcher, and ``torch.compile`` of the transformer's blocks; and diffusers with
  PyTorch's memory-efficient attention kernel, a second exact kernel whose distance from
  the default calibrates what "the same output" means in bfloat16.

A render is 832x480, 81 frames (Jacana keeps 80: 5 s at 16 fps), guidance 5.0, the same
seed and prompts, ``--steps`` denoising steps (10 by default: 50 would not fit the GPU
machine's call limit; a 50-step render is projected from the measured step time). Each
configuration renders once at ``--warmup-steps`` first (the compilation happens there);
``diffusers`` and ``jacana`` then alternate for ``--reps`` renders, the others render once.
Times: a CUDA synchronize before every clock read; per-step seconds from the step
callbacks (the first step, which follows the text encoding, is left out); text encoding
from hooks around the encoder; VAE decode around ``vae.decode``; the tail is from the
last step to the frames on the host. Peak memory: ``torch.cuda.max_memory_allocated``
during the render (reset before it) less what was allocated before it, plus the weights
that configuration uses (its transformer, the text encoder and the VAE), so it is what a
process holding that pipeline alone would peak at.

Equivalence: the uint8 frames and the final latents of each configuration against
diffusers' (mean and max absolute frame difference; latents' relative L2), beside the
distance between diffusers' own two exact attention kernels. One transformer forward of
each variant is also compared with a float32 copy of the same weights. Probes: the two
classifier-free-guidance passes as one batch of 2 against two batches of 1, and VAE
decode variants (cuDNN autotuning, channels-last, bfloat16 -- the last one approximate).

Writes ``<out>/video_gpu/<hardware>.{json,md}`` (hardware: ``h200``, ``h100``; by
default ``bench/results``) and prints the table last.

Usage: python bench/video_gpu.py [--steps 10] [--reps 3] [--out DIR]
       python bench/video_gpu.py --smoke --out /tmp/x   (CPU, toy sizes: the script runs)
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import itertools
import json
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    RESULTS_DIR,
    environment,
    fmt_spread,
    hardware,
    package_versions,
    results_paths,
    spread,
    write_results,
)

PROMPT = "a red fox runs across a snowy field at dawn, cinematic, 4k"
NEGATIVE = "blurry, low quality, static, distorted"
SEED = 42
GUIDANCE = 5.0
TEXT_ENCODER_XXL = dict(d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64)
TRANSFORMER_1_3B = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=12,
    attention_head_dim=128,
    in_channels=16,
    out_channels=16,
    text_dim=4096,
    freq_dim=256,
    ffn_dim=8960,
    num_layers=30,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    rope_max_seq_len=1024,
)
REAL = dict(width=832, height=480, seconds=5, fps=16)
SMOKE = dict(width=64, height=64, seconds=1, fps=8)
GIB = 2**30


class Clock:
    """Timestamps of the render in progress: after each step, around each text-encoder
    forward and each VAE decode; the decode's input (the final latents) is kept."""

    def __init__(self, device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.steps: list[float] = []
        self.text_s = 0.0
        self.decode_s = 0.0
        self.latents = None

    def now(self) -> float:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def step(self, *_: Any) -> dict:
        self.steps.append(self.now())
        return {}

    def watch(self, text_encoder, vae) -> None:
        """Hooks on the shared text encoder and VAE (each peer's calls pass through them)."""
        started: list[float] = []
        text_encoder.register_forward_pre_hook(lambda *_: started.append(self.now()))

        def text_done(*_: Any) -> None:
            self.text_s += self.now() - started.pop()

        text_encoder.register_forward_hook(text_done)
        decode = vae.decode

        def timed_decode(z, *args, **kwargs):
            self.latents = z.detach().clone()
            t0 = self.now()
            out = decode(z, *args, **kwargs)
            self.decode_s += self.now() - t0
            return out

        vae.decode = timed_decode


def build(args, device, dtype):
    """(tokenizer, text encoder, transformer, vae, scheduler config, build seconds)."""
    import torch
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from jacana_multimodal.pipelines import tiny_wan

    seconds = {}
    torch.manual_seed(SEED)
    t0 = time.perf_counter()
    tokenizer = tiny_wan.train_tokenizer()
    text_config = tiny_wan._TEXT_ENCODER if args.smoke else TEXT_ENCODER_XXL
    if args.text_layers:
        text_config = {**text_config, "num_layers": args.text_layers}
    with torch.device(device):
        text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), **text_config))
    text_encoder = text_encoder.to(dtype).eval()
    seconds["text_encoder"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with torch.device(device):
        transformer = WanTransformer3DModel(
            **(tiny_wan._TRANSFORMER if args.smoke else TRANSFORMER_1_3B)
        )
    # As from_pretrained(dtype=...) leaves it: the modules diffusers keeps in float32 stay
    # so, buffers (the rotary tables) too.
    keep = set(transformer._keep_in_fp32_modules or ())
    for name, param in transformer.named_parameters():
        if not keep & set(name.split(".")):
            param.data = param.data.to(dtype)
    transformer.eval()
    seconds["transformer"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with torch.device(device):
        vae = AutoencoderKLWan(**tiny_wan._VAE) if args.smoke else AutoencoderKLWan()
    vae.eval()
    seconds["vae"] = time.perf_counter() - t0
    return tokenizer, text_encoder, transformer, vae, dict(tiny_wan._SCHEDULER), seconds


def weight_bytes(*modules) -> int:
    seen, total = set(), 0
    for module in modules:
        for t in [*module.parameters(), *module.buffers()]:
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total


def frames_u8(frames) -> np.ndarray:
    from jacana_multimodal.pipelines.wan import to_uint8

    return frames if frames.dtype == np.uint8 else to_uint8(frames)


def difference(frames: np.ndarray, latents, ref_frames: np.ndarray, ref_latents) -> dict:
    """Frames (uint8) and final latents of one configuration against the reference's."""
    n = min(len(frames), len(ref_frames))
    d = np.abs(frames[:n].astype(np.int16) - ref_frames[:n].astype(np.int16))
    a, b = latents.double(), ref_latents.double()
    return {
        "frames_mean_abs": float(d.mean()),
        "frames_p99_abs": float(np.percentile(d, 99)),
        "frames_max_abs": int(d.max()),
        "frames_share_differing": float((d > 0).mean()),
        "latents_rel_l2": float((a - b).norm() / b.norm()),
        "finite": bool(a.isfinite().all()),
    }


class Bench:
    def __init__(self, args) -> None:
        import torch

        from jacana_multimodal.pipelines.base import RenderRequest
        from jacana_multimodal.pipelines.wan import frames_to_render

        self.args = args
        cuda = torch.cuda.is_available() and not args.smoke
        self.device = torch.device("cuda" if cuda else "cpu")
        self.dtype = torch.bfloat16 if cuda else torch.float32
        size = SMOKE if args.smoke else REAL
        self.request = RenderRequest(
            prompt=PROMPT,
            negative_prompt=NEGATIVE,
            seed=SEED,
            num_inference_steps=args.steps,
            guidance_scale=GUIDANCE,
            **size,
        )
        self.num_frames = frames_to_render(self.request.num_frames)
        self.clock = Clock(self.device)
        self.doc: dict[str, Any] = {
            "benchmark": "video_gpu",
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "environment": environment(),
            "versions": package_versions("diffusers"),
            "settings": {
                "steps": args.steps,
                "warmup_steps": args.warmup_steps,
                "reps": args.reps,
                "size": f"{size['width']}x{size['height']}",
                "frames_rendered": self.num_frames,
                "frames_kept_by_jacana": self.request.num_frames,
                "guidance_scale": GUIDANCE,
                "seed": SEED,
                "dtype": str(self.dtype).removeprefix("torch."),
                "smoke": args.smoke,
            },
            "build_s": {},
            "results": {},
            "differences": {},
            "errors": {},
        }
        self.runs: dict[str, list[dict]] = {}
        self.started = time.monotonic()

    # -- the peers ----------------------------------------------------------------------

    def pipeline(self, transformer):
        from diffusers import UniPCMultistepScheduler, WanPipeline

        pipe = WanPipeline(
            tokenizer=self.tokenizer,
            text_encoder=self.text_encoder,
            transformer=transformer,
            vae=self.vae,
            scheduler=UniPCMultistepScheduler(**self.scheduler),
        )
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def diffusers_call(self, pipe, steps: int, output_type: str = "np"):
        import torch

        r = self.request
        out = pipe(
            prompt=r.prompt,
            negative_prompt=r.negative_prompt,
            height=r.height,
            width=r.width,
            num_frames=self.num_frames,
            num_inference_steps=steps,
            guidance_scale=r.guidance_scale,
            generator=torch.Generator(device=self.device).manual_seed(r.seed),
            output_type=output_type,
            callback_on_step_end=self.clock.step,
        )
        return out.frames[0]

    def jacana_call(self, steps: int):
        import dataclasses

        request = dataclasses.replace(self.request, num_inference_steps=steps)
        return self.model.render(request, self.clock.step)

    def setup(self) -> None:
        from jacana_multimodal.pipelines import cards
        from jacana_multimodal.pipelines.wan import WanVideoModel
        from jacana_multimodal.settings import MultimodalSettings

        parts = build(self.args, self.device, self.dtype)
        self.tokenizer, self.text_encoder, self.transformer, self.vae, self.scheduler, built = parts
        self.doc["build_s"] = built
        self.doc["model"] = {
            "weights": "random (the real architecture and shapes)",
            "transformer_params": sum(p.numel() for p in self.transformer.parameters()),
            "text_encoder_params": sum(p.numel() for p in self.text_encoder.parameters()),
            "vae_params": sum(p.numel() for p in self.vae.parameters()),
            "text_encoder_layers": self.text_encoder.config.num_layers,
        }
        self.clock.watch(self.text_encoder, self.vae)
        self.plain = self.pipeline(self.transformer)
        cuda_compile = MultimodalSettings().cuda_compile
        self.model = WanVideoModel(
            self.pipeline(copy.deepcopy(self.transformer)),
            cards.WAN21_T2V,
            cuda_compile=cuda_compile,
        )
        if self.device.type == "cuda":
            import torch

            order = torch._C._get_sdp_priority_order()
            self.doc["settings"]["sdpa_priority"] = [
                torch.nn.attention.SDPBackend(i).name for i in order
            ]
        self.doc["settings"]["jacana"] = {
            "cuda_compile": cuda_compile,
            "compiled": self.model.compiled,
        }
        self.warm_vae()
        shared = (self.text_encoder, self.vae)
        self.resident = {
            "diffusers": weight_bytes(self.transformer, *shared),
            "jacana": weight_bytes(self.model.pipeline.transformer, *shared),
        }

    def warm_vae(self) -> None:
        """One decode of two latent frames at the render's size: the convolutions' first
        calls stay out of the first timed render."""
        import torch
        from diffusers import AutoencoderKLWan

        scale = 2 ** len(self.vae.config.temperal_downsample)
        shape = (
            1,
            self.vae.config.z_dim,
            2,
            self.request.height // scale,
            self.request.width // scale,
        )
        with torch.inference_mode():
            AutoencoderKLWan.decode(self.vae, torch.randn(shape, device=self.device))

    # -- timing -------------------------------------------------------------------------

    def timed(self, run: Callable[[], Any], resident: int) -> dict:
        import torch

        cuda = self.device.type == "cuda"
        self.clock.reset()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        t0 = self.clock.now()
        frames = run()
        t1 = self.clock.now()
        steps = self.clock.steps
        result = {
            "render_s": t1 - t0,
            "step_s": [b - a for a, b in itertools.pairwise(steps)],
            "text_s": self.clock.text_s,
            "decode_s": self.clock.decode_s,
            "tail_s": t1 - steps[-1],
            "peak_gib": (torch.cuda.max_memory_allocated() - before + resident) / GIB
            if cuda
            else None,
            "frames": frames_u8(frames),
            "latents": self.clock.latents,
        }
        return result

    def record(self, name: str, result: dict) -> None:
        self.runs.setdefault(name, []).append(result)
        print(
            f"[bench] {name}: render {result['render_s']:.2f} s, step "
            f"{statistics.median(result['step_s']) if result['step_s'] else 0:.3f} s, "
            f"decode {result['decode_s']:.2f} s",
            flush=True,
        )

    def warm(self, name: str, run: Callable[[], Any]) -> None:
        t0 = self.clock.now()
        run()
        seconds = self.clock.now() - t0
        self.doc.setdefault("warmup_s", {})[name] = seconds
        print(f"[bench] {name}: warm-up render ({self.args.warmup_steps} steps) {seconds:.1f} s")

    def guarded(self, name: str, body: Callable[[], None]) -> None:
        """Run one section; a failure is recorded and the rest goes on. A section is
        skipped when less than a minute is left before ``--deadline-s``."""
        if time.monotonic() - self.started > self.args.deadline_s - 60:
            self.doc["errors"][name] = "skipped: out of time"
            print(f"[bench] {name} skipped: out of time", flush=True)
            return
        try:
            body()
        except Exception as exc:  # a section that fails must not cost the others
            self.doc["errors"][name] = f"{type(exc).__name__}: {exc}"
            print(f"[bench] {name} FAILED: {exc}", flush=True)
            traceback.print_exc()
        self.summarize()
        self.save()

    # -- sections -----------------------------------------------------------------------

    def peer(self, name: str) -> Callable[[], Any]:
        if name == "diffusers":
            return lambda: self.diffusers_call(self.plain, self.args.steps)
        return lambda: self.jacana_call(self.args.steps)

    def diffusers_first(self) -> None:
        """diffusers warmed up (without decoding: the VAE was warmed at set-up) and its
        first render: the reference every other configuration is compared with."""
        self.warm(
            "diffusers", lambda: self.diffusers_call(self.plain, self.args.warmup_steps, "latent")
        )
        self.record("diffusers", self.timed(self.peer("diffusers"), self.resident["diffusers"]))

    def jacana_and_reps(self) -> None:
        """Jacana warmed up (compilation included) and its first render, then the
        remaining renders of both, alternating (diffusers, Jacana, Jacana, diffusers...)."""
        self.warm("jacana", lambda: self.jacana_call(self.args.warmup_steps))
        self.record("jacana", self.timed(self.peer("jacana"), self.resident["jacana"]))
        for rep in range(1, self.args.reps):
            order = ["jacana", "diffusers"] if rep % 2 else ["diffusers", "jacana"]
            for name in order:
                self.record(name, self.timed(self.peer(name), self.resident[name]))

    def backend(self, name: str) -> str:
        """diffusers' attention backend ``name``; on a CPU (``--smoke``), its default: the
        CUDA kernels are not there, and the smoke run only checks that the script runs."""
        return name if self.device.type == "cuda" else "native"

    def alone(self, name: str, prepare: Callable[[Any], None]) -> None:
        """Plain diffusers with one change to a scratch copy of its transformer."""
        transformer = self.scratch
        prepare(transformer)
        pipe = self.pipeline(transformer)
        self.warm(name, lambda: self.diffusers_call(pipe, self.args.warmup_steps, "latent"))
        resident = weight_bytes(transformer, self.text_encoder, self.vae)
        self.record(name, self.timed(lambda: self.diffusers_call(pipe, self.args.steps), resident))

    def forward_probe(self) -> None:
        """One transformer forward of each variant against a float32 copy of the same
        weights, and the guidance passes batched against one at a time."""
        import torch

        r, device = self.request, self.device
        vae_scale = 2 ** len(self.vae.config.temperal_downsample)
        shape = (
            1,
            self.transformer.config.in_channels,
            (self.num_frames - 1) // 4 + 1,
            r.height // vae_scale,
            r.width // vae_scale,
        )
        gen = torch.Generator(device=device).manual_seed(SEED)
        latents = torch.randn(shape, generator=gen, device=device).to(self.dtype)
        timestep = torch.tensor([500.0], device=device)
        with torch.inference_mode():
            cond, uncond = self.plain.encode_prompt(
                r.prompt,
                r.negative_prompt,
                max_sequence_length=512,
                device=device,
                dtype=self.dtype,
            )

            def forward(transformer, x, embeds):
                t = timestep.expand(x.shape[0])
                return transformer(
                    hidden_states=x, timestep=t, encoder_hidden_states=embeds, return_dict=False
                )[0]

            reference = copy.deepcopy(self.transformer).float()
            ref = forward(reference, latents.float(), cond.float()).double()
            del reference
            variants = {
                "diffusers": self.transformer,
                "cuDNN attention forced (eager)": self.scratch,
                "jacana": self.model.pipeline.transformer,
            }
            errors = {}
            for name, transformer in variants.items():
                out = forward(transformer, latents, cond).double()
                errors[name] = float((out - ref).norm() / ref.norm())
            self.doc["forward_rel_l2_vs_float32"] = errors
            print(f"[bench] one forward vs float32: {errors}", flush=True)

            # classifier-free guidance: cond and uncond as one batch of 2 (eager, cuDNN)
            def one_at_a_time():
                return torch.cat(
                    [forward(self.scratch, latents, cond), forward(self.scratch, latents, uncond)]
                )

            def batched():
                both = torch.cat([cond, uncond])
                return forward(self.scratch, latents.expand(2, *latents.shape[1:]), both)

            probes = {"two batches of 1": one_at_a_time, "one batch of 2": batched}
            times: dict[str, list[float]] = {name: [] for name in probes}
            outs = {}
            for _ in range(self.args.probe_reps):
                for name, fn in probes.items():
                    t0 = self.clock.now()
                    outs[name] = fn()
                    times[name].append(self.clock.now() - t0)
            a, b = outs.values()
            self.doc["cfg_batch"] = {name: spread(values) for name, values in times.items()}
            self.doc["cfg_batch"]["max_abs_difference"] = float((a - b).abs().max())
            print(f"[bench] guidance passes: {self.doc['cfg_batch']}", flush=True)

    def vae_probe(self) -> None:
        """Decode the diffusers render's final latents several ways."""
        import torch
        from diffusers import AutoencoderKLWan

        z = self.runs["diffusers"][0]["latents"]

        def decode(z, vae=self.vae):  # the class's decode, past the clock's wrapper
            return AutoencoderKLWan.decode(vae, z, return_dict=False)[0]

        def pixels(video) -> torch.Tensor:
            return ((video.float() / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)

        def timed(fn, reps: int = 1):
            seconds, out = [], None
            for _ in range(reps):
                t0 = self.clock.now()
                with torch.inference_mode():
                    out = fn()
                seconds.append(self.clock.now() - t0)
            return seconds, pixels(out)

        base_s, base = timed(lambda: decode(z))
        probes = {"float32 (default)": {"decode_s": spread(base_s)}}

        def add(name, seconds, out):
            d = (out.int() - base.int()).abs()
            probes[name] = {
                "decode_s": spread(seconds),
                "frames_mean_abs": float(d.float().mean()),
                "frames_max_abs": int(d.max()),
            }
            print(f"[bench] VAE {name}: {probes[name]}", flush=True)

        torch.backends.cudnn.benchmark = True
        try:
            tune_s, _ = timed(lambda: decode(z))
            seconds, out = timed(lambda: decode(z))
        finally:
            torch.backends.cudnn.benchmark = False
        add("float32, cudnn.benchmark", seconds, out)
        probes["float32, cudnn.benchmark"]["autotune_decode_s"] = tune_s[0]
        if self.device.type == "cuda":
            channels_last = copy.deepcopy(self.vae).to(memory_format=torch.channels_last_3d)
            seconds, out = timed(lambda: decode(z, channels_last))
            add("float32, channels_last_3d", seconds, out)
            del channels_last
            half = copy.deepcopy(self.vae).to(torch.bfloat16)
            seconds, out = timed(lambda: decode(z.to(torch.bfloat16), half))
            add("bfloat16 (approximate)", seconds, out)
            del half
        self.doc["vae_decode"] = probes

    def run(self) -> None:
        # The order puts first what a short call must not miss: the reference, the largest
        # lever alone, then the served configuration; probes and the rest last.
        self.setup()
        self.guarded("diffusers", self.diffusers_first)
        self.scratch = copy.deepcopy(self.transformer)
        self.guarded(
            "cudnn attention",
            lambda: self.alone(
                "diffusers + cuDNN attention forced",
                lambda t: t.set_attention_backend(self.backend("_native_cudnn")),
            ),
        )
        self.guarded("jacana", self.jacana_and_reps)
        if not self.args.no_probes:
            self.guarded("forward probe", self.forward_probe)
        self.guarded(
            "efficient attention",
            lambda: self.alone(
                "diffusers, memory-efficient attention",
                lambda t: t.set_attention_backend(self.backend("_native_efficient")),
            ),
        )

        def compile_blocks(t):
            t.set_attention_backend("native")
            t.compile_repeated_blocks(fullgraph=True)

        self.guarded("compile", lambda: self.alone("diffusers + torch.compile", compile_blocks))
        if not self.args.no_probes:
            self.guarded("vae probe", self.vae_probe)

    # -- results ------------------------------------------------------------------------

    def summarize(self) -> None:
        results, diffs = {}, {}
        ref = self.runs.get("diffusers", [None])[0]
        for name, runs in self.runs.items():
            steps = [s for r in runs for s in r["step_s"]]
            row = {
                "renders": len(runs),
                "step_s": spread(steps) if steps else None,
                "render_s": spread([r["render_s"] for r in runs]),
                "text_s": spread([r["text_s"] for r in runs]),
                "decode_s": spread([r["decode_s"] for r in runs]),
                "tail_s": spread([r["tail_s"] for r in runs]),
                "peak_gib": spread([r["peak_gib"] for r in runs])
                if runs[0]["peak_gib"] is not None
                else None,
            }
            if steps:
                # a 50-step render: the measured one with the missing steps added
                extra = 50 - self.args.steps
                row["projected_50_step_render_s"] = (
                    row["render_s"]["median"] + extra * row["step_s"]["median"]
                )
            results[name] = row
            if ref is not None:
                diffs[name] = difference(
                    runs[0]["frames"], runs[0]["latents"], ref["frames"], ref["latents"]
                )
                if len(runs) > 1:
                    again = difference(
                        runs[1]["frames"], runs[1]["latents"], runs[0]["frames"], runs[0]["latents"]
                    )
                    diffs[name]["run_to_run_frames_max_abs"] = again["frames_max_abs"]
        self.doc["results"], self.doc["differences"] = results, diffs
        if "diffusers" in results and "jacana" in results:
            d, j = self.runs["diffusers"], self.runs["jacana"]
            med = lambda runs, key: [statistics.median(r[key]) for r in runs]  # noqa: E731
            self.doc["ratios"] = {
                "step": results["diffusers"]["step_s"]["median"]
                / results["jacana"]["step_s"]["median"],
                "step_per_rep": spread(
                    [a / b for a, b in zip(med(d, "step_s"), med(j, "step_s"), strict=False)]
                ),
                "render": results["diffusers"]["render_s"]["median"]
                / results["jacana"]["render_s"]["median"],
                "render_per_rep": spread(
                    [a["render_s"] / b["render_s"] for a, b in zip(d, j, strict=False)]
                ),
                "projected_50_step_render": results["diffusers"]["projected_50_step_render_s"]
                / results["jacana"]["projected_50_step_render_s"],
            }

    def save(self) -> None:
        machine = hardware("cuda" if self.device.type == "cuda" else "cpu")
        json_path, _ = results_paths(self.args.out, "video_gpu", machine)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(self.doc, indent=2, default=str) + "\n")

    def finish(self) -> None:
        machine = hardware("cuda" if self.device.type == "cuda" else "cpu")
        table = render(self.doc)
        write_results(self.args.out, "video_gpu", self.doc, table, machine)
        print(table)


def render(doc: dict) -> str:
    s, env = doc["settings"], doc["environment"]
    steps = s["steps"]
    results, diffs = doc["results"], doc["differences"]
    base = results.get("diffusers", {}).get("step_s")
    lines = [
        f"# Wan 2.1 T2V 1.3B on {env.get('gpu', 'CPU')}: Jacana vs diffusers",
        "",
        f"Random {s['dtype']} weights with the real shapes; {s['size']}, {s['frames_rendered']} "
        f"frames, guidance {s['guidance_scale']}, {steps} denoising steps, seed {s['seed']}. "
        f"Seconds per step: median (min–max) over the steps of every render after the first "
        f"step; renders: median (min–max) of {s['reps']} alternating renders for diffusers and "
        "Jacana, one render for the others. Jacana: "
        f"{doc['settings'].get('jacana')}; SDPA's kernel order here: "
        f"{', '.join(doc['settings'].get('sdpa_priority', ['-']))}.",
        "",
        f"| configuration | s / step | speed-up per step | render s ({steps} steps) | "
        "50-step render s (projected) | text encode s | VAE decode s | tail s | peak GiB | "
        "frames vs diffusers: mean / max abs | latents rel L2 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in results.items():
        d = diffs.get(name, {})
        speedup = (
            f"{base['median'] / row['step_s']['median']:.2f}×" if base and row["step_s"] else "-"
        )
        projected = row.get("projected_50_step_render_s")
        lines.append(
            f"| {name} | {fmt_spread(row['step_s'], 3)} | {speedup} | "
            f"{fmt_spread(row['render_s'])} | {f'{projected:.1f}' if projected else '-'} | "
            f"{fmt_spread(row['text_s'], 3)} | {fmt_spread(row['decode_s'])} | "
            f"{fmt_spread(row['tail_s'])} | {fmt_spread(row['peak_gib'], 1)} | "
            f"{d.get('frames_mean_abs', 0):.3f} / {d.get('frames_max_abs', 0)} | "
            f"{d.get('latents_rel_l2', 0):.2e} |"
        )
    ratios = doc.get("ratios")
    if ratios:
        lines += [
            "",
            f"Jacana / diffusers: **{ratios['step']:.2f}×** per step (per render "
            f"{ratios['step_per_rep']['min']:.2f}–{ratios['step_per_rep']['max']:.2f}), "
            f"**{ratios['render']:.2f}×** per {steps}-step render "
            f"({ratios['render_per_rep']['min']:.2f}–{ratios['render_per_rep']['max']:.2f}), "
            f"{ratios['projected_50_step_render']:.2f}× projected for 50 steps.",
        ]
    forward = doc.get("forward_rel_l2_vs_float32")
    if forward:
        lines += [
            "",
            "One transformer forward against a float32 copy of the same weights "
            "(relative L2): " + ", ".join(f"{k} {v:.2e}" for k, v in forward.items()) + ".",
        ]
    cfg = doc.get("cfg_batch")
    if cfg:
        lines += [
            "",
            "Guidance passes (one forward each, eager, cuDNN attention): two batches of 1 "
            f"{fmt_spread(cfg['two batches of 1'], 3)} s, one batch of 2 "
            f"{fmt_spread(cfg['one batch of 2'], 3)} s; outputs differ by at most "
            f"{cfg['max_abs_difference']:.2e}.",
        ]
    vae = doc.get("vae_decode")
    if vae:
        lines += ["", "| VAE decode | s | frames vs float32 default: mean / max abs |"]
        lines.append("|---|---:|---:|")
        for name, row in vae.items():
            diff = (
                f"{row['frames_mean_abs']:.3f} / {row['frames_max_abs']}"
                if "frames_mean_abs" in row
                else "-"
            )
            lines.append(f"| {name} | {fmt_spread(row['decode_s'])} | {diff} |")
    if doc.get("warmup_s"):
        lines += [
            "",
            f"Warm-up renders ({s['warmup_steps']} steps, compilation included): "
            + ", ".join(f"{k} {v:.1f} s" for k, v in doc["warmup_s"].items())
            + ".",
        ]
    if doc.get("errors"):
        lines += ["", "Failed: " + "; ".join(f"{k}: {v}" for k, v in doc["errors"].items())]
    lines += [
        "",
        f"{env.get('gpu', 'CPU')}, power limit {env.get('nvidia-smi power.limit', '?')}, "
        f"driver {env.get('nvidia-smi driver_version', '?')}; torch {env.get('torch')}, "
        f"diffusers {doc['versions'].get('diffusers')}, transformers "
        f"{env.get('transformers')}; {doc['date']}.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--probe-reps", type=int, default=2)
    parser.add_argument("--text-layers", type=int, default=0, help="UMT5 layers (0: UMT5-XXL's 24)")
    parser.add_argument("--no-probes", action="store_true", help="skip the forward and VAE probes")
    parser.add_argument(
        "--deadline-s", type=float, default=400.0, help="skip what would start after this"
    )
    parser.add_argument("--smoke", action="store_true", help="CPU, toy sizes")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results root")
    args = parser.parse_args()
    if args.steps < 3 or args.reps < 1:
        parser.error("--steps must be at least 3 and --reps at least 1")
    bench = Bench(args)
    bench.run()
    bench.finish()


if __name__ == "__main__":
    main()
