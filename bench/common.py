"""Shared helpers of the benchmarks: statistics, random prompts, results files.

Medians come with (min, max) over repetitions. A run's result is one JSON document plus a
Markdown table rendered from it, at ``<root>/<benchmark>/<hardware>.{json,md}`` (root:
``bench/results`` unless ``--out`` says otherwise); a rerun on the same hardware
overwrites them, and git keeps the history.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
CONFIGS_DIR = Path(__file__).resolve().parent / "configs"


def config_dir(model: str) -> Path:
    """``bench/configs/<model>``, or ``model`` itself when it is a directory."""
    return Path(model) if Path(model).is_dir() else CONFIGS_DIR / model


def dummy_engine_config(model: str, *, kv_gib: float, device: str = "cuda", **fields: Any):
    """The benchmarks' ``EngineConfig``: random bf16 weights of ``model``'s shapes
    (``config_dir``), a ``kv_gib`` KV pool, 2,048-token context, 64 sequences, seed 1;
    ``fields`` add or replace ``EngineConfig`` fields."""
    from jacana_engine.config import EngineConfig  # the engine only where one is built

    settings: dict[str, Any] = dict(
        model=str(config_dir(model) / "config.json"),
        load_format="dummy",
        dtype="bfloat16",
        device=device,
        kv_cache_memory=int(kv_gib * 2**30),
        max_model_len=2048,
        max_num_seqs=64,
        seed=1,
    )
    return EngineConfig(**{**settings, **fields})


def triton_cache_kernels(root: Path | None = None) -> dict[str, dict[str, str]]:
    """The kernels compiled into a Triton cache (``root``, default: the one Triton uses,
    ``$TRITON_CACHE_DIR`` or ``~/.triton/cache``): {entry dir: {"kernel": name,
    "signature": its TTIR ``tt.func`` arguments, which tell one specialization from
    another}}. Entries without TTIR (launcher modules) are not kernels and are left out."""
    if root is None:
        root = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    kernels: dict[str, dict[str, str]] = {}
    for entry in root.iterdir() if root.is_dir() else ():
        ttir = next(entry.glob("*.ttir"), None)
        if ttir is None:
            continue
        match = re.search(r"tt\.func public @(\w+)\((.*?)\)\s*(attributes|\{)", ttir.read_text())
        name, args = (match.group(1), match.group(2)) if match else (ttir.stem, "?")
        kernels[entry.name] = {"kernel": name, "signature": args}
    return kernels


def spread(values: list[float]) -> dict[str, Any]:
    """{"median", "min", "max", "n", "values"} of repetitions: what every result reports."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "values": values,
    }


def fmt_spread(s: dict[str, Any] | None, digits: int = 2) -> str:
    """ "median (min–max)" of a :func:`spread`, or "-" when there is none."""
    if not s:
        return "-"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def fmt_ratio(ratio: float, per_rep: dict[str, Any]) -> str:
    """A headline ratio in bold with the range of the per-repetition ratios."""
    return f"**{ratio:.2f}×** ({per_rep['min']:.2f}–{per_rep['max']:.2f})"


# Common English words the embedding benchmarks build their sentences from
_VOCABULARY = (
    "the a of to and in is was for on that with as by it at from his an were are which "
    "this be have had not but they one all their or has been more when who will would "
    "time people year city new first two world state government company market system "
    "water river music school history science language house street night morning game "
    "report children family policy energy research health computer network model data "
    "early later during between against under across toward quickly slowly carefully "
    "announced described reported found built opened started grew moved changed said"
)
WORDS = _VOCABULARY.split()


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """``n`` prompts of ``length`` token ids drawn uniformly (never all zeros), each distinct,
    so no prompt shares a cached prefix with another."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(length)] for _ in range(n)]


def environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        for gpu in _nvidia_smi_ids(torch.cuda.current_device()):
            facts = gpu_facts(gpu)
            if facts:
                env.update(facts)
                break
    return env


# nvidia-smi's names of what sets a GPU's speed beyond its name: H200s of one name differ
# in power limit (an NVL card's is lower than an SXM one's) and so in the SM clock that
# latency-bound kernels follow, while their HBM bandwidth is the same
GPU_FACTS = ("driver_version", "power.limit", "clocks.max.sm", "clocks.sm", "clocks.mem")


def _nvidia_smi_ids(device: int) -> list[str]:
    """How ``nvidia-smi -i`` may name CUDA device ``device``, best first: by its UUID,
    which ``CUDA_VISIBLE_DEVICES`` and CUDA's own device order do not renumber (where
    torch gives it), then by its index."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return ([f"GPU-{uuid}"] if uuid is not None else []) + [str(device)]


def gpu_facts(gpu: str = "0") -> dict[str, str]:
    """{"nvidia-smi " + field: value} of the GPU that ``nvidia-smi -i`` calls ``gpu`` (an
    index or a UUID) for the fields of ``GPU_FACTS`` (values as nvidia-smi prints them,
    with units); {} where nvidia-smi is missing or fails."""
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(GPU_FACTS)}", "--format=csv,noheader",
             "-i", gpu],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {}
    values = [v.strip() for v in lines[0].split(",")]
    if len(values) != len(GPU_FACTS):
        return {}
    return {f"nvidia-smi {field}": value for field, value in zip(GPU_FACTS, values, strict=True)}


def cpu_model() -> str:
    """The processor's marketing name, for the record of where a CPU benchmark ran."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_machine(load_avg_start: tuple[float, float, float]) -> dict[str, Any]:
    """Where a CPU benchmark ran: processor, cores, torch threads, load before and after."""
    import torch

    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_avg_start": load_avg_start,
        "load_avg_end": os.getloadavg(),
    }


def cpu_machine_line(machine: dict[str, Any], versions: dict[str, str], date: str) -> str:
    """The Markdown footer of a CPU benchmark: ``cpu_machine`` and ``package_versions``
    (Python, torch, then each peer package) in one sentence."""
    m = machine
    peers = "".join(
        f", {name} {v}" for name, v in versions.items() if name not in ("python", "torch")
    )
    return (
        f"Machine: {m['cpu']}, {m['logical_cpus']} logical CPUs, torch threads "
        f"{m['torch_threads']}, load average {m['load_avg_start'][0]:.2f} at start and "
        f"{m['load_avg_end'][0]:.2f} at end. Python {versions['python']}, torch "
        f"{versions['torch']}{peers}, {date}."
    )


def package_versions(*distributions: str) -> dict[str, str]:
    """Python, torch and the named installed distributions' versions."""
    import importlib.metadata

    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__}
    versions.update({d: importlib.metadata.version(d) for d in distributions})
    return versions


def hardware(device: str = "cuda") -> str:
    """What a result is named by: the GPU's model in lower case ("h200", "h100") where
    ``device`` is a CUDA device and one is there, else ``cpu-<logical CPUs>core``."""
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            words = torch.cuda.get_device_name(torch.device(device)).lower().split()
            named = [w for w in words if w != "nvidia" and any(c.isdigit() for c in w)]
            return re.sub(r"[^a-z0-9.-]+", "-", (named or words)[0])
    return f"cpu-{os.cpu_count()}core"


def results_paths(root: Path, benchmark: str, machine: str) -> tuple[Path, Path]:
    """``root/benchmark/machine.json`` and ``.md``: where a run's result goes."""
    folder = root / benchmark
    return folder / f"{machine}.json", folder / f"{machine}.md"


def write_results(
    root: Path, benchmark: str, doc: dict[str, Any], table: str, machine: str
) -> tuple[Path, Path]:
    """Write ``results_paths(root, benchmark, machine)``, each replaced atomically, and say
    where."""
    paths = results_paths(root, benchmark, machine)
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    texts = json.dumps(doc, indent=2) + "\n", table.rstrip("\n") + "\n"
    for path, text in zip(paths, texts, strict=True):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    print(f"[bench] wrote {paths[0]} and {paths[1]}", flush=True)
    return paths
