"""docker-compose.yml and the Dockerfile's service targets: valid, healthchecked, non-root.

With a compose binary on the machine (`docker compose` or `docker-compose`) the file is
validated by it and the checks run on its normalized output; without one they run on the
file as PyYAML reads it. The checks themselves are the same either way.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
GPU_OVERLAY = ROOT / "infra" / "compose.gpu.yml"


def compose_command() -> list[str] | None:
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def compose_config(*files: Path) -> dict:
    """The effective configuration: from the compose binary if there is one, else the YAML
    files merged by compose's rules for mappings (later files win key by key)."""
    command = compose_command()
    if command is None:
        merged: dict = {}
        for f in files:
            merged = merge_mappings(merged, yaml.safe_load(interpolate_defaults(f.read_text())))
        return merged
    args = [*command, "--project-directory", str(ROOT)]
    for f in files:
        args += ["-f", str(f)]
    # A clean environment, so the defaults in the file are what is checked.
    env = {k: v for k, v in os.environ.items() if not k.startswith("JACANA_")}
    result = subprocess.run([*args, "config"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def merge_mappings(base: dict, overlay: dict) -> dict:
    """Compose's merge of ``overlay`` onto ``base``: mappings merge recursively (an
    ``environment`` list is read as its mapping), sequences concatenate, scalars replace."""
    out = dict(base)
    for key, value in overlay.items():
        old = out.get(key)
        if key == "environment":
            old = environment({key: old or {}})
            value = environment({key: value or {}})
        if isinstance(old, dict) and isinstance(value, dict):
            out[key] = merge_mappings(old, value)
        elif isinstance(old, list) and isinstance(value, list):
            out[key] = [*old, *(v for v in value if v not in old)]
        else:
            out[key] = value
    return out


def interpolate_defaults(text: str) -> str:
    """Compose's ${VAR:-default} / ${VAR} substitution, with every variable unset."""
    text = re.sub(r"\$\{\w+(?::?-([^}]*))?\}", lambda m: m.group(1) or "", text)
    return text.replace("$$", "$")


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):  # the list form: ["KEY=value", ...]
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def is_non_root(user: str) -> bool:
    name = str(user).split(":", 1)[0]
    return name not in ("", "0", "root")


@pytest.fixture(scope="module")
def config() -> dict:
    return compose_config(COMPOSE)


SERVICES = ["drafter", "engine", "embeddings", "asr", "multimodal", "gateway"]


def test_every_service_builds_its_own_target_of_the_dockerfile(config):
    services = config["services"]
    assert set(SERVICES) <= services.keys()
    for name in SERVICES:
        build = services[name]["build"]
        assert (ROOT / build["context"]).resolve() == ROOT
        assert (ROOT / build["dockerfile"]).resolve() == DOCKERFILE
        assert build["target"] == name
        assert name in stages(DOCKERFILE.read_text())


def stages(text: str) -> dict[str, str]:
    """The Dockerfile's named stages: {name: its text from ``FROM`` to the next one}."""
    found = {}
    for part in re.split(r"(?m)^(?=FROM )", text):
        named = re.match(r"FROM \S+ AS (\S+)", part)
        if named:
            found[named.group(1)] = part
    return found


@pytest.mark.parametrize("name", SERVICES)
def test_services_are_healthchecked_and_run_as_non_root(config, name):
    service = config["services"][name]
    test = service["healthcheck"]["test"]
    command = " ".join(test) if isinstance(test, list) else test
    assert f"jacana-healthcheck {name}" in command
    assert is_non_root(service["user"])


def test_gateway_waits_for_healthy_backends_and_is_published(config):
    gateway = config["services"]["gateway"]
    assert gateway["depends_on"]["engine"]["condition"] == "service_healthy"
    assert gateway["depends_on"]["embeddings"]["condition"] == "service_healthy"
    ports = [
        str(p) if not isinstance(p, dict) else f"{p['published']}:{p['target']}"
        for p in gateway["ports"]
    ]
    assert any(p.endswith("8000:8000") for p in ports), ports
    engines = environment(gateway)["JACANA_GATEWAY_ENGINES"]
    assert "engine:50051" in engines
    assert "engine:50051" not in str(config["services"]["engine"].get("ports", ""))
    embeddings = json.loads(environment(gateway)["JACANA_GATEWAY_EMBEDDINGS"])
    assert embeddings == {"all-minilm-l6-v2": ["embeddings:50061"]}
    assert "ports" not in config["services"]["embeddings"]
    assert gateway["depends_on"]["asr"]["condition"] == "service_healthy"
    assert json.loads(environment(gateway)["JACANA_GATEWAY_ASR"]) == {
        "whisper-tiny.en": ["asr:50081"]
    }
    assert "ports" not in config["services"]["asr"]


def test_backends_listen_where_the_gateway_looks(config):
    env = environment(config["services"]["engine"])
    assert env["JACANA_ENGINE_HOST"] == "0.0.0.0"
    assert env["JACANA_ENGINE_PORT"] == "50051"
    env = environment(config["services"]["embeddings"])
    assert env["JACANA_EMBEDDINGS_HOST"] == "0.0.0.0"
    assert env["JACANA_EMBEDDINGS_PORT"] == "50061"
    assert env["JACANA_EMBEDDINGS_MODEL_ID"] == "all-minilm-l6-v2"
    env = environment(config["services"]["asr"])
    assert env["JACANA_ASR_HOST"] == "0.0.0.0"
    assert env["JACANA_ASR_PORT"] == "50081"
    assert env["JACANA_ASR_MODEL_ID"] == "whisper-tiny.en"


def test_engine_drafts_through_the_drafter_only_when_asked(config):
    """Speculation is off by default; naming a proposer is the one step that turns it on,
    and the engine is already pointed at the drafter service."""
    engine = config["services"]["engine"]
    env = environment(engine)
    assert env["JACANA_ENGINE_SPECULATIVE_PROPOSER"] == "none"
    assert env["JACANA_ENGINE_SPECULATIVE_TRANSPORT"] == "remote"
    assert env["JACANA_ENGINE_DRAFTER_ADDRESS"] == "drafter:50071"
    assert engine["depends_on"]["drafter"]["condition"] == "service_started"
    drafter = config["services"]["drafter"]
    env = environment(drafter)
    assert env["JACANA_DRAFTER_HOST"] == "0.0.0.0"
    assert env["JACANA_DRAFTER_PORT"] == "50071"
    assert "ports" not in drafter  # reached by the engine on the compose network only
    targets = [v.split(":")[1] if isinstance(v, str) else v["target"] for v in drafter["volumes"]]
    assert "/models" in targets  # where a draft model comes from


def test_videos_render_in_a_worker_fed_by_a_persistent_redis(config):
    """Redis keeps its append-only file in a volume; the multimodal service and the render
    worker share it and the artifact volume; the worker renders one video at a time; the
    gateway routes the video model to the service."""
    services = config["services"]
    redis = services["redis"]
    assert redis["build"]["target"] == "redis"
    assert "appendonly" in stages(DOCKERFILE.read_text())["redis"]
    assert any(str(v).endswith("/data") or v.get("target") == "/data" for v in redis["volumes"])
    multimodal, render = services["multimodal"], services["render"]
    assert render["image"] == multimodal["image"]
    for service in (multimodal, render):
        assert environment(service)["JACANA_MULTIMODAL_REDIS_URL"] == "redis://redis:6379/0"
        assert is_non_root(service["user"])
    command = " ".join(render["command"])
    assert "jacana_multimodal.worker worker" in command and "--concurrency 1" in command
    assert "jacana-healthcheck render" in " ".join(render["healthcheck"]["test"])
    assert multimodal["depends_on"]["redis"]["condition"] == "service_healthy"

    def volume_of(service: dict, target: str) -> str:
        for v in service["volumes"]:
            source, _, rest = v.partition(":") if isinstance(v, str) else (v["source"], "", "")
            if (rest.split(":")[0] if isinstance(v, str) else v["target"]) == target:
                return source
        raise AssertionError(f"no volume at {target}")

    videos = "/home/jacana/videos"
    assert volume_of(multimodal, videos) == volume_of(render, videos)
    gateway = services["gateway"]
    assert gateway["depends_on"]["multimodal"]["condition"] == "service_healthy"
    assert json.loads(environment(gateway)["JACANA_GATEWAY_VIDEOS"]) == {
        "wan-tiny-random": ["multimodal:50091"]
    }


def test_transcription_jobs_run_in_a_worker_on_the_video_jobs_redis(config):
    """The ASR service and its transcription worker share the video jobs' Redis, one
    environment and the storage volume; the worker is the asr image with Celery's command,
    one job at a time, and waits for the service."""
    services = config["services"]
    asr, worker = services["asr"], services["asr-worker"]
    assert worker["image"] == asr["image"]
    assert is_non_root(worker["user"])
    for service in (asr, worker):
        env = environment(service)
        assert env["JACANA_ASR_REDIS_URL"] == "redis://redis:6379/0"
        assert env["JACANA_ASR_STORAGE_DIR"] == "/home/jacana/transcriptions"
    assert environment(worker) == environment(asr)
    assert environment(services["multimodal"])["JACANA_MULTIMODAL_REDIS_URL"] == (
        "redis://redis:6379/0"
    )
    command = " ".join(worker["command"])
    assert "jacana_asr.worker worker -Q jacana.transcription" in command
    assert "--concurrency 1" in command
    assert "inspect ping" in " ".join(worker["healthcheck"]["test"])
    assert asr["depends_on"]["redis"]["condition"] == "service_healthy"
    assert worker["depends_on"]["asr"]["condition"] == "service_healthy"

    def volume_at(service: dict, target: str) -> str:
        for v in service["volumes"]:
            source, _, rest = v.partition(":") if isinstance(v, str) else (v["source"], "", "")
            if (rest.split(":")[0] if isinstance(v, str) else v["target"]) == target:
                return source
        raise AssertionError(f"no volume at {target}")

    storage = "/home/jacana/transcriptions"
    assert volume_at(asr, storage) == volume_at(worker, storage)
    found = stages(DOCKERFILE.read_text())
    assert "libs/jobs" in found["asr-build"]
    assert f"install -d -o 10001 -g 10001 {storage}" in found["asr"]


def test_gpu_overlay_merges():
    merged = compose_config(COMPOSE, GPU_OVERLAY)
    engine = merged["services"]["engine"]
    assert environment(engine)["JACANA_ENGINE_DEVICE"] == "cuda"
    devices = engine["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    render = merged["services"]["render"]
    assert environment(render)["JACANA_MULTIMODAL_DEVICE"] == "cuda"
    assert render["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 1


@pytest.mark.parametrize("name", SERVICES)
def test_service_targets_drop_root_and_carry_the_probe(name):
    """Each service's target runs its own module as an unprivileged user, on the runtime
    stage that carries the health probe, with the environment its build stage made."""
    text = DOCKERFILE.read_text()
    found = stages(text)
    target = found[name]
    assert re.match(r"FROM runtime AS ", target)
    assert "scripts/healthcheck.py /usr/local/bin/jacana-healthcheck" in found["runtime"]
    users = re.findall(r"(?m)^USER\s+(\S+)", target)
    assert users and is_non_root(users[-1])
    assert f"COPY --from={name}-build /opt/jacana /opt/jacana" in target
    assert f'CMD ["jacana-healthcheck", "{name}"]' in target
    assert re.search(rf'(?m)^CMD \["python", "-m", "jacana_{name}"\]', target)
    assert f"services/{name}/" in found[f"{name}-build"]
    for source in re.findall(r"(?m)^COPY (?!--from)(\S+)", text):
        assert (ROOT / source).exists(), f"the Dockerfile copies missing {source}"


def test_gpu_overlay_keeps_the_engines_compiled_kernels_and_tunings_in_a_volume():
    """A GPU engine's first start compiles its Triton kernels and times its decode GEMMs;
    both land under the user's ~/.cache, which the overlay mounts from a named volume, so
    a recreated container reads them back. The image creates that folder as the user, so
    the new volume is the user's to write."""
    from jacana_engine.entrypoints.settings import EngineSettings

    overlay = yaml.safe_load(interpolate_defaults(GPU_OVERLAY.read_text()))
    cache = "/home/jacana/.cache"
    assert f"engine-cache:{cache}" in overlay["services"]["engine"]["volumes"]
    assert "engine-cache" in overlay["volumes"]
    found = stages(DOCKERFILE.read_text())
    assert re.search(rf"install -d -o 10001 -g 10001 {cache}\b", found["runtime"])
    assert re.search(rf"TRITON_CACHE_DIR={cache}/", found["engine"])
    tuning = EngineSettings.model_fields["tuning_cache"].default
    assert tuning.startswith("~/.cache/")  # under the volume: the user's home is /home/jacana
    assert "--home-dir /home/jacana" in found["runtime"]
