"""Run the Jacana stack (drafter, engine, embeddings, ASR, video, gateway) as child
processes: ``make up``.

The supervisor (``scripts/supervisor.py``) owns the children: each runs in its own
session, its output is echoed with a ``[name]`` prefix and written to
``.run/logs/<name>.log``, and readiness is read from the services' own health endpoints
(gRPC health for the drafter, the engine, the embeddings, the ASR and the multimodal
service, a PING for Redis, the "ready" line of the render worker, HTTP /health for the
gateway). SIGINT/SIGTERM stop every child (SIGTERM, then SIGKILL after a grace period); a
child that dies takes the others down and the supervisor exits non-zero. This file plans
the stack: which services, their ports, commands and environments.

Configuration is the services' own environment (``JACANA_ENGINE_*``, ``JACANA_DRAFTER_*``,
``JACANA_EMBEDDINGS_*``, ``JACANA_ASR_*``, ``JACANA_GATEWAY_*``), passed through unchanged;
the supervisor only fills in what joins them (each unless set explicitly): the services'
ports, the gateway's ``ENGINES``, ``EMBEDDINGS`` and ``ASR`` maps, and the engine's drafter
address.

Speculative decoding stays off unless ``JACANA_ENGINE_SPECULATIVE_PROPOSER`` names a
proposer; then the engine drafts through the drafter this stack runs (the ``remote``
transport, the same topology as the compose stack) unless
``JACANA_ENGINE_SPECULATIVE_TRANSPORT`` says otherwise, and the engine's proposer settings
carry over to the drafter. ``JACANA_STACK_EMBEDDINGS=0`` / ``JACANA_STACK_ASR=0`` /
``JACANA_STACK_DRAFTER=0`` leave those services out (without a drafter, a proposer runs in
the engine).

Video: a ``redis-server`` on a free loopback port (append-only persistence, data in
``.run/redis``), the multimodal service and one Celery render worker (concurrency 1), with
the artifacts in ``.run/videos``. ``JACANA_MULTIMODAL_REDIS_URL`` points them at another
Redis instead (then none is started); ``JACANA_STACK_VIDEO=0`` leaves all three out.

Transcription jobs: with the ASR service and the video part both on, the ASR service and one
Celery transcription worker (``asr-worker``, concurrency 1) use the video part's Redis, with
the uploads and results in ``.run/transcriptions``; ``JACANA_ASR_REDIS_URL`` names another
Redis (then the worker runs even without the video part).

Multilingual speech: when the Whisper base packages are installed (requirements/models.txt),
a second ASR service (``asr-whisper-base``, port ``JACANA_STACK_WHISPER_BASE_PORT``, default
50082) serves ``whisper-base`` beside the default model, without transcription jobs, and the
gateway's ``ASR`` map names both; ``JACANA_STACK_WHISPER_BASE=0`` leaves it out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from supervisor import Probe, Service, grpc_probe, http_probe, say, supervise

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL_ID = "smollm2-135m-instruct"
DEFAULT_EMBEDDINGS_MODEL_ID = "all-minilm-l6-v2"
DEFAULT_ASR_MODEL_ID = "whisper-tiny.en"
WHISPER_BASE_MODEL_ID = "whisper-base"  # jacana_asr.model_packages.WHISPER_BASE_ID
DEFAULT_ENGINE_PORT = 50051
DEFAULT_EMBEDDINGS_PORT = 50061
DEFAULT_DRAFTER_PORT = 50071
DEFAULT_ASR_PORT = 50081
DEFAULT_WHISPER_BASE_PORT = 50082
DEFAULT_MULTIMODAL_PORT = 50091
DEFAULT_VIDEO_MODEL_ID = "wan-tiny-random"
RENDER_QUEUE = "jacana.video"  # jacana_multimodal.service.RENDER_QUEUE
TRANSCRIPTION_QUEUE = "jacana.transcription"  # jacana_asr.settings.AsrSettings.job_queue
DEFAULT_GATEWAY_PORT = 8000


# --- the real stack ---------------------------------------------------------------------


def _port(env: dict[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    try:
        port = int(raw) if raw else default
    except ValueError:
        raise SystemExit(f"[stack] {name} must be a port number, got {raw!r}") from None
    if not 0 <= port <= 65535:
        raise SystemExit(f"[stack] {name} must be 0..65535, got {port}")
    return port or _free_port()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_free(host: str, port: int, variable: str) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise SystemExit(
                f"[stack] cannot listen on {host}:{port} ({exc.strerror}); "
                f"stop whatever uses it or set {variable}"
            ) from None


def _local(host: str) -> str:
    """The address a client on this machine uses for a server bound to ``host``."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def _enabled(env: dict[str, str], name: str) -> bool:
    raw = env.get(name, "1").strip().lower()
    if raw in ("1", "true", "yes", "on", ""):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise SystemExit(f"[stack] {name} must be 1 or 0, got {raw!r}")


# Engine settings of the in-process proposers and the drafter settings that mean the same,
# so that one set of variables configures the proposer wherever it runs.
DRAFTER_MIRRORS = {
    "JACANA_DRAFTER_NGRAM_MIN": "JACANA_ENGINE_SPECULATIVE_NGRAM_MIN",
    "JACANA_DRAFTER_NGRAM_MAX": "JACANA_ENGINE_SPECULATIVE_NGRAM_MAX",
    "JACANA_DRAFTER_DRAFT_MODEL": "JACANA_ENGINE_SPECULATIVE_DRAFT_MODEL",
    "JACANA_DRAFTER_DRAFT_NUM_KV_BLOCKS": "JACANA_ENGINE_SPECULATIVE_DRAFT_NUM_KV_BLOCKS",
    "JACANA_DRAFTER_DEVICE": "JACANA_ENGINE_DEVICE",
    "JACANA_DRAFTER_DTYPE": "JACANA_ENGINE_DTYPE",
}


@dataclass(frozen=True)
class Speculation:
    """What the banner says about speculative decoding.

    proposer: the engine's proposer setting ("none": off); transport: "inprocess" or
    "remote"; drafter: the address the engine drafts from (remote transport only).
    """

    proposer: str = "none"
    transport: str = "inprocess"
    drafter: str | None = None

    @property
    def enabled(self) -> bool:
        return self.proposer not in ("", "none")

    def describe(self) -> str:
        if not self.enabled:
            return "off (JACANA_ENGINE_SPECULATIVE_PROPOSER=ngram|suffix|draft_model turns it on)"
        if self.transport == "remote":
            return f"{self.proposer}, drafted by the drafter at {self.drafter}"
        return f"{self.proposer}, drafted inside the engine"


@dataclass(frozen=True)
class StackPlan:
    """The children in start order, and what the banner shows.

    ``embeddings`` / ``asr`` / ``drafter`` are None when ``JACANA_STACK_EMBEDDINGS=0`` /
    ``JACANA_STACK_ASR=0`` / ``JACANA_STACK_DRAFTER=0`` leave the service out.
    """

    engine: Service
    gateway: Service
    base_url: str
    model_id: str
    embeddings: Service | None = None
    embeddings_model_id: str | None = None
    drafter: Service | None = None
    speculation: Speculation = Speculation()
    asr: Service | None = None
    asr_model_id: str | None = None
    video: tuple[Service, ...] = ()  # Redis (unless external), multimodal, render worker
    video_model_id: str | None = None
    asr_worker: Service | None = None  # transcription jobs, on the video part's Redis
    whisper_base: Service | None = None  # the multilingual model's ASR service

    @property
    def services(self) -> list[Service]:
        """Start order: the drafter before the engine that drafts from it; Redis before the
        multimodal service and the workers; the gateway last, since its /health needs the
        others serving."""
        order = (
            self.drafter,
            self.engine,
            self.embeddings,
            self.asr,
            self.whisper_base,
            *self.video,
            self.asr_worker,
            self.gateway,
        )
        return [s for s in order if s is not None]


def redis_probe(port: int) -> Probe:
    """Redis answers PING (a raw RESP exchange: no client library needed here)."""

    async def probe() -> bool:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        try:
            writer.write(b"PING\r\n")
            await writer.drain()
            return (await asyncio.wait_for(reader.readline(), 1.0)).startswith(b"+PONG")
        except (OSError, TimeoutError):
            return False
        finally:
            writer.close()

    return probe


def output_probe(service: Service, marker: str) -> Probe:
    """Ready once ``marker`` appeared in the service's output (Celery's "ready." line)."""

    async def probe() -> bool:
        return any(marker in line for line in service.tail)

    return probe


def _video_model_id(env: dict[str, str]) -> str:
    raw = env.get("JACANA_MULTIMODAL_MODELS", "").strip()
    if not raw:
        return DEFAULT_VIDEO_MODEL_ID
    try:
        return json.loads(raw)[0]["id"]
    except (ValueError, LookupError, TypeError):
        raise SystemExit(
            "[stack] JACANA_MULTIMODAL_MODELS must be a JSON list of {id, ...}"
        ) from None


def plan_video(
    env: dict[str, str], host: str, port: int, log_dir: Path, run_dir: Path = ROOT / ".run"
) -> tuple[Service, ...]:
    """Redis (unless ``JACANA_MULTIMODAL_REDIS_URL`` names one), the multimodal service and
    one render worker, sharing the Redis and the artifact directory."""
    python = sys.executable
    services: list[Service] = []
    video_env = {
        "JACANA_MULTIMODAL_STORAGE_DIR": str(run_dir / "videos"),
        **env,
    }
    if not env.get("JACANA_MULTIMODAL_REDIS_URL"):
        redis_port = _free_port()
        data = run_dir / "redis"
        data.mkdir(parents=True, exist_ok=True)
        services.append(
            Service(
                name="redis",
                argv=["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                      "--dir", str(data), "--appendonly", "yes", "--appendfsync", "everysec",
                      "--protected-mode", "yes"],
                env=dict(env),
                probe=redis_probe(redis_port),
                log_path=log_dir / "redis.log",
            )
        )  # fmt: skip
        video_env["JACANA_MULTIMODAL_REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
    services.append(
        Service(
            name="multimodal",
            argv=[python, "-m", "jacana_multimodal"],
            env={**video_env, "JACANA_MULTIMODAL_HOST": host, "JACANA_MULTIMODAL_PORT": str(port)},
            probe=grpc_probe(f"{_local(host)}:{port}"),
            log_path=log_dir / "multimodal.log",
        )
    )
    worker = Service(
        name="render",
        argv=[python, "-m", "celery", "-A", "jacana_multimodal.worker", "worker",
              "-Q", RENDER_QUEUE, "--concurrency", "1", "--pool", "prefork",
              "-n", "render@%h", "--without-gossip", "--without-mingle", "--loglevel", "INFO"],
        env=video_env,
        probe=lambda: asyncio.sleep(0, False),
        log_path=log_dir / "render.log",
    )  # fmt: skip
    worker.probe = output_probe(worker, " ready.")
    services.append(worker)
    return tuple(services)


def plan_asr_worker(
    asr: Service, redis_url: str, log_dir: Path, run_dir: Path = ROOT / ".run"
) -> Service:
    """One transcription worker sharing ``asr``'s environment, both on ``redis_url``;
    sets the jobs' Redis and storage directory of the service (unless already set)."""
    asr.env.setdefault("JACANA_ASR_REDIS_URL", redis_url)
    asr.env.setdefault("JACANA_ASR_STORAGE_DIR", str(run_dir / "transcriptions"))
    queue = asr.env.get("JACANA_ASR_JOB_QUEUE") or TRANSCRIPTION_QUEUE
    worker = Service(
        name="asr-worker",
        argv=[sys.executable, "-m", "celery", "-A", "jacana_asr.worker", "worker",
              "-Q", queue, "--concurrency", "1", "--pool", "prefork",
              "-n", "asr@%h", "--without-gossip", "--without-mingle", "--loglevel", "INFO"],
        env=asr.env,
        probe=lambda: asyncio.sleep(0, False),
        log_path=log_dir / "asr-worker.log",
    )  # fmt: skip
    worker.probe = output_probe(worker, " ready.")
    return worker


def _whisper_base_dir() -> str:
    """The assembled Whisper base checkpoint (joined on first use); empty when its packages
    are not installed."""
    from jacana_asr.model_packages import whisper_base_path  # torch-free
    from jacana_common.model_parts import AssetError

    try:
        return whisper_base_path()
    except AssetError as exc:
        raise SystemExit(f"[stack] {exc}; JACANA_STACK_WHISPER_BASE=0 leaves it out") from None


def plan_whisper_base(env: dict[str, str], host: str, log_dir: Path) -> Service | None:
    """The ASR service of ``whisper-base``, or None when it is left out or not installed."""
    if not _enabled(env, "JACANA_STACK_WHISPER_BASE"):
        return None
    model_dir = _whisper_base_dir()
    if not model_dir:
        return None
    port = _port(env, "JACANA_STACK_WHISPER_BASE_PORT", DEFAULT_WHISPER_BASE_PORT)
    _check_free(host, port, "JACANA_STACK_WHISPER_BASE_PORT")
    return Service(
        name="asr-whisper-base",
        argv=[sys.executable, "-m", "jacana_asr"],
        env={
            **env,
            "JACANA_ASR_HOST": host,
            "JACANA_ASR_PORT": str(port),
            "JACANA_ASR_MODEL": model_dir,
            "JACANA_ASR_MODEL_ID": WHISPER_BASE_MODEL_ID,
            "JACANA_ASR_REDIS_URL": "",  # jobs stay with the default model's worker
        },
        probe=grpc_probe(f"{_local(host)}:{port}"),
        log_path=log_dir / "asr-whisper-base.log",
    )


def _speculation(env: dict[str, str], drafter_target: str | None) -> Speculation:
    """The engine's proposer and transport: remote through this stack's drafter unless the
    environment picks a transport, in-process when the stack runs no drafter."""
    proposer = env.get("JACANA_ENGINE_SPECULATIVE_PROPOSER", "").strip() or "none"
    transport = env.get("JACANA_ENGINE_SPECULATIVE_TRANSPORT", "").strip()
    if not transport:
        transport = "remote" if drafter_target is not None else "inprocess"
    drafter = env.get("JACANA_ENGINE_DRAFTER_ADDRESS") or drafter_target or "127.0.0.1:50071"
    return Speculation(proposer, transport, drafter if transport == "remote" else None)


def plan(env: dict[str, str], log_dir: Path) -> StackPlan:
    """Decide ports, the gateway's model maps and the engine's drafter from ``env``; build
    the services."""
    env = {**env, "PYTHONUNBUFFERED": "1"}
    with_embeddings = _enabled(env, "JACANA_STACK_EMBEDDINGS")
    with_drafter = _enabled(env, "JACANA_STACK_DRAFTER")
    with_asr = _enabled(env, "JACANA_STACK_ASR")
    with_video = _enabled(env, "JACANA_STACK_VIDEO")
    engine_host = env.get("JACANA_ENGINE_HOST", "127.0.0.1")
    embeddings_host = env.get("JACANA_EMBEDDINGS_HOST", "127.0.0.1")
    drafter_host = env.get("JACANA_DRAFTER_HOST", "127.0.0.1")
    asr_host = env.get("JACANA_ASR_HOST", "127.0.0.1")
    multimodal_host = env.get("JACANA_MULTIMODAL_HOST", "127.0.0.1")
    gateway_host = env.get("JACANA_GATEWAY_HOST", "127.0.0.1")
    engine_port = _port(env, "JACANA_ENGINE_PORT", DEFAULT_ENGINE_PORT)
    embeddings_port = (
        _port(env, "JACANA_EMBEDDINGS_PORT", DEFAULT_EMBEDDINGS_PORT) if with_embeddings else 0
    )
    drafter_port = _port(env, "JACANA_DRAFTER_PORT", DEFAULT_DRAFTER_PORT) if with_drafter else 0
    asr_port = _port(env, "JACANA_ASR_PORT", DEFAULT_ASR_PORT) if with_asr else 0
    multimodal_port = (
        _port(env, "JACANA_MULTIMODAL_PORT", DEFAULT_MULTIMODAL_PORT) if with_video else 0
    )
    gateway_port = _port(env, "JACANA_GATEWAY_PORT", DEFAULT_GATEWAY_PORT)
    _check_free(engine_host, engine_port, "JACANA_ENGINE_PORT")
    if with_embeddings:
        _check_free(embeddings_host, embeddings_port, "JACANA_EMBEDDINGS_PORT")
    if with_drafter:
        _check_free(drafter_host, drafter_port, "JACANA_DRAFTER_PORT")
    if with_asr:
        _check_free(asr_host, asr_port, "JACANA_ASR_PORT")
    if with_video:
        _check_free(multimodal_host, multimodal_port, "JACANA_MULTIMODAL_PORT")
    _check_free(gateway_host, gateway_port, "JACANA_GATEWAY_PORT")
    model_id = env.get("JACANA_ENGINE_MODEL_ID") or DEFAULT_MODEL_ID
    engine_target = f"{_local(engine_host)}:{engine_port}"
    engines = env.get("JACANA_GATEWAY_ENGINES") or json.dumps({model_id: [engine_target]})

    python = sys.executable
    drafter = None
    drafter_target = f"{_local(drafter_host)}:{drafter_port}" if with_drafter else None
    if drafter_target is not None:
        drafter_env = {**env, "JACANA_DRAFTER_HOST": drafter_host}
        drafter_env["JACANA_DRAFTER_PORT"] = str(drafter_port)
        for mirror, source in DRAFTER_MIRRORS.items():
            if not env.get(mirror) and env.get(source):
                drafter_env[mirror] = env[source]
        drafter = Service(
            name="drafter",
            argv=[python, "-m", "jacana_drafter"],
            env=drafter_env,
            probe=grpc_probe(drafter_target),
            log_path=log_dir / "drafter.log",
        )
    speculation = _speculation(env, drafter_target)
    engine_env = {**env, "JACANA_ENGINE_HOST": engine_host, "JACANA_ENGINE_PORT": str(engine_port)}
    if speculation.enabled:  # off: the engine's own defaults, untouched
        engine_env["JACANA_ENGINE_SPECULATIVE_TRANSPORT"] = speculation.transport
        if speculation.drafter is not None:
            engine_env["JACANA_ENGINE_DRAFTER_ADDRESS"] = speculation.drafter
    engine = Service(
        name="engine",
        argv=[python, "-m", "jacana_engine"],
        env=engine_env,
        probe=grpc_probe(engine_target),
        log_path=log_dir / "engine.log",
    )
    gateway_env = {
        **env,
        "JACANA_GATEWAY_HOST": gateway_host,
        "JACANA_GATEWAY_PORT": str(gateway_port),
        "JACANA_GATEWAY_ENGINES": engines,
    }
    embeddings = embeddings_model_id = None
    if with_embeddings:
        embeddings_model_id = env.get("JACANA_EMBEDDINGS_MODEL_ID") or DEFAULT_EMBEDDINGS_MODEL_ID
        embeddings_target = f"{_local(embeddings_host)}:{embeddings_port}"
        embeddings = Service(
            name="embeddings",
            argv=[python, "-m", "jacana_embeddings"],
            env={
                **env,
                "JACANA_EMBEDDINGS_HOST": embeddings_host,
                "JACANA_EMBEDDINGS_PORT": str(embeddings_port),
            },
            probe=grpc_probe(embeddings_target),
            log_path=log_dir / "embeddings.log",
        )
        gateway_env["JACANA_GATEWAY_EMBEDDINGS"] = env.get(
            "JACANA_GATEWAY_EMBEDDINGS"
        ) or json.dumps({embeddings_model_id: [embeddings_target]})
    asr = asr_model_id = whisper_base = None
    if with_asr:
        asr_model_id = env.get("JACANA_ASR_MODEL_ID") or DEFAULT_ASR_MODEL_ID
        asr_target = f"{_local(asr_host)}:{asr_port}"
        asr = Service(
            name="asr",
            argv=[python, "-m", "jacana_asr"],
            env={**env, "JACANA_ASR_HOST": asr_host, "JACANA_ASR_PORT": str(asr_port)},
            probe=grpc_probe(asr_target),
            log_path=log_dir / "asr.log",
        )
        asr_models = {asr_model_id: [asr_target]}
        whisper_base = plan_whisper_base(env, asr_host, log_dir)
        if whisper_base is not None:
            whisper_base_port = whisper_base.env["JACANA_ASR_PORT"]
            asr_models[WHISPER_BASE_MODEL_ID] = [f"{_local(asr_host)}:{whisper_base_port}"]
        gateway_env["JACANA_GATEWAY_ASR"] = env.get("JACANA_GATEWAY_ASR") or json.dumps(asr_models)
    video: tuple[Service, ...] = ()
    video_model_id = None
    if with_video:
        video_model_id = _video_model_id(env)
        video = plan_video(env, multimodal_host, multimodal_port, log_dir)
        gateway_env["JACANA_GATEWAY_VIDEOS"] = env.get("JACANA_GATEWAY_VIDEOS") or json.dumps(
            {video_model_id: [f"{_local(multimodal_host)}:{multimodal_port}"]}
        )
    asr_worker = None
    if asr is not None:
        jobs_redis = env.get("JACANA_ASR_REDIS_URL") or next(
            (s.env["JACANA_MULTIMODAL_REDIS_URL"] for s in video if s.name == "multimodal"), ""
        )
        if jobs_redis:
            asr_worker = plan_asr_worker(asr, jobs_redis, log_dir)
    base_url = f"http://{_local(gateway_host)}:{gateway_port}"
    gateway = Service(
        name="gateway",
        argv=[python, "-m", "jacana_gateway"],
        env=gateway_env,
        probe=http_probe(f"{base_url}/health"),
        log_path=log_dir / "gateway.log",
    )
    return StackPlan(
        engine=engine,
        gateway=gateway,
        base_url=base_url,
        model_id=model_id,
        embeddings=embeddings,
        embeddings_model_id=embeddings_model_id,
        drafter=drafter,
        speculation=speculation,
        asr=asr,
        asr_model_id=asr_model_id,
        video=video,
        video_model_id=video_model_id,
        asr_worker=asr_worker,
        whisper_base=whisper_base,
    )


def banner(
    base_url: str,
    model_id: str,
    log_dir: Path,
    embeddings_model_id: str | None = None,
    speculation: Speculation | None = None,
    asr_model_id: str | None = None,
    video_model_id: str | None = None,
    multilingual_asr_model_id: str | None = None,
) -> str:
    question = "What is the capital of France?"
    messages = [{"role": "user", "content": question}]
    body = json.dumps({"model": model_id, "messages": messages, "temperature": 0})
    embeddings = ""
    if embeddings_model_id:
        embeddings = f"""
  vectors = client.embeddings.create(
      model="{embeddings_model_id}",
      input=["A heron waits in the shallows.", "Herons hunt fish."],
  )
  print(len(vectors.data[0].embedding))
"""
    speech = ""
    if asr_model_id:
        speech = f"""
  with open("speech.wav", "rb") as audio:
      text = client.audio.transcriptions.create(model="{asr_model_id}", file=audio)
  print(text.text)
"""
    if multilingual_asr_model_id:
        speech += f"""  with open("speech.wav", "rb") as audio:  # any language, to English
      english = client.audio.translations.create(model="{multilingual_asr_model_id}", file=audio)
  print(english.text)
"""
    video = ""
    if video_model_id:
        video = f"""
  video = client.videos.create_and_poll(
      model="{video_model_id}", prompt="A heron lands on a quiet lake.", seconds="2"
  )
  client.videos.download_content(video.id).write_to_file("heron.mp4")
"""
    served = ", ".join(
        m
        for m in (
            model_id,
            embeddings_model_id,
            asr_model_id,
            multilingual_asr_model_id,
            video_model_id,
        )
        if m
    )
    return f"""
Jacana is up: {base_url}   (models: {served})
Speculative decoding: {(speculation or Speculation()).describe()}

Try it with curl:

  curl -s {base_url}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{body}'

or with the OpenAI SDK (.venv/bin/python):

  from openai import OpenAI
  client = OpenAI(base_url="{base_url}/v1", api_key="unused")
  reply = client.chat.completions.create(
      model="{model_id}",
      messages=[{{"role": "user", "content": "{question}"}}],
      temperature=0,
  )
  print(reply.choices[0].message.content)
{embeddings}{speech}{video}
Logs: {log_dir}/   Ctrl-C stops everything.
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=float(os.environ.get("JACANA_STACK_START_TIMEOUT", 900)),
        help="seconds to wait for every service to report healthy (default 900)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=float(os.environ.get("JACANA_STACK_GRACE", 20)),
        help="seconds a service gets to exit after SIGTERM before SIGKILL (default 20)",
    )
    parser.add_argument("--log-dir", type=Path, default=ROOT / ".run" / "logs")
    args = parser.parse_args(argv)

    args.log_dir.mkdir(parents=True, exist_ok=True)
    stack = plan(dict(os.environ), args.log_dir)
    where = [f"engine on {stack.engine.env['JACANA_ENGINE_PORT']}"]
    if stack.drafter is not None:
        where.insert(0, f"drafter on {stack.drafter.env['JACANA_DRAFTER_PORT']}")
    if stack.embeddings is not None:
        where.append(f"embeddings on {stack.embeddings.env['JACANA_EMBEDDINGS_PORT']}")
    if stack.asr is not None:
        where.append(f"asr on {stack.asr.env['JACANA_ASR_PORT']}")
    if stack.whisper_base is not None:
        where.append(f"whisper-base asr on {stack.whisper_base.env['JACANA_ASR_PORT']}")
    for service in stack.video:
        if service.name == "multimodal":
            where.append(f"multimodal on {service.env['JACANA_MULTIMODAL_PORT']}")
    say(", ".join([*where, f"gateway on {stack.base_url}"]))
    say(f"speculative decoding: {stack.speculation.describe()}")
    ready_text = banner(
        stack.base_url,
        stack.model_id,
        args.log_dir,
        stack.embeddings_model_id,
        stack.speculation,
        stack.asr_model_id,
        stack.video_model_id,
        WHISPER_BASE_MODEL_ID if stack.whisper_base is not None else None,
    )
    return asyncio.run(
        supervise(
            stack.services,
            start_timeout_s=args.start_timeout,
            grace_s=args.grace,
            on_ready=lambda: print(ready_text, flush=True),
        )
    )


if __name__ == "__main__":
    sys.exit(main())
