"""The gateway image, built from the real Dockerfile and run (podman), and the exact-copy wheel.

1. `test_dockerfile_copies_every_package`: every package pyproject.toml ships is COPYed by the Dockerfile.
2. `test_wheel_from_dockerfile_copies_serves` (the fallback, ~20 s, runs everywhere): a wheel is built from
   exactly the paths the Dockerfile COPYs, installed --no-deps into a clean venv (dependencies reused from
   the project's venv through a .pth path line, which adds no editable finder), and `llmgw serve` from it
   answers /health/live and a chat completion through a fake upstream.
3. `test_image_builds_and_serves` (podman; skipped where podman is not installed): the image is built from
   the Dockerfile on a Debian bookworm base made locally (deploy/ci/build-base.sh; no registry here), run
   read-only, as uid 10001 with every capability dropped, and answers a chat completion through the fake
   upstream. About 70 s the first time (pip installs the runtime lock), seconds once the layers are cached.

LLMGW_DOCKERFILE names another Dockerfile to check (the closing note of issue 41 runs the old one).
Podman on this kind of machine needs runc (crun refuses hybrid cgroups) and ulimits no higher than the
hard limits here (root cannot raise them): see deploy/README.md, "The image in CI".
"""

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes import free_port

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = Path(os.environ.get("LLMGW_DOCKERFILE", ROOT / "Dockerfile"))
BASE_IMAGE = os.environ.get("LLMGW_BASE_IMAGE", "localhost/llmgw-base:bookworm")
IMAGE = "localhost/llmgw:ci"
MASTER_KEY = "sk-llmgw-image-test"
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "*.db")


def dockerfile_copies(text: str) -> list[str]:
    """Sources of the COPY instructions that read the build context (not `COPY --from=...`)."""
    sources: list[str] = []
    for line in text.replace("\\\n", " ").splitlines():
        words = line.split()
        if not words or words[0].upper() != "COPY" or any(w.startswith("--from") for w in words):
            continue
        sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


def shipped_packages() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {p.rstrip("*") for p in config["tool"]["setuptools"]["packages"]["find"]["include"]}


def test_dockerfile_copies_every_package() -> None:
    copied = set(dockerfile_copies(DOCKERFILE.read_text()))
    assert shipped_packages() <= copied, f"the Dockerfile does not COPY {sorted(shipped_packages() - copied)}"
    assert {"pyproject.toml", "README.md", "requirements"} <= copied


def test_dockerfile_installs_from_the_hashed_locks_on_a_base_given_as_argument() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG BASE=python:3\.11-slim$", text, re.M) and text.count("FROM ${BASE}") == 2
    assert "--require-hashes --no-deps -r requirements/build.txt" in text
    assert (
        '--require-hashes --no-deps ${EXTRAS:+--extra-index-url "$TORCH_INDEX"} -r "requirements/${EXTRAS:-runtime}.txt"'
        in text
    )
    assert "pip install --no-deps --no-build-isolation ." in text
    for lock in ("build", "runtime", "semantic"):
        assert "--hash=sha256:" in (ROOT / f"requirements/{lock}.txt").read_text()


def fake_upstream() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "tests.fakes", "--port", str(port)], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: get(url + "/v1/models") == 200, "the fake upstream", process, 60)
    return process, url


@pytest.fixture
def upstream() -> Iterator[str]:
    process, url = fake_upstream()
    yield url
    process.terminate()
    process.wait(10)


def get(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None


def wait_for(check: object, what: str, process: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{what} exited with status {process.returncode}")
        assert time.monotonic() < deadline, f"{what} did not come up in {timeout_s:.0f} s"
        time.sleep(0.2)


def models(upstream_url: str) -> str:
    deployment = {"name": "fake-upstream", "base_url": upstream_url + "/v1", "model": "upstream-model"}
    return json.dumps([{"name": "fake", "deployments": [deployment]}])


def gateway_env(upstream_url: str, port: int) -> dict[str, str]:
    return {"LLMGW_MASTER_KEY": MASTER_KEY, "LLMGW_PORT": str(port), "LLMGW_MODELS": models(upstream_url),
            "LLMGW_CACHE__ENABLED": "false", "HF_HUB_OFFLINE": "1"}  # fmt: skip


def assert_serves(url: str, process: subprocess.Popen[bytes] | None, log: Path) -> None:
    try:
        wait_for(lambda: get(url + "/health/live") == 200, "the gateway", process, 120)
    except AssertionError as error:
        raise AssertionError(f"{error}; its output:\n{log.read_text()[-3000:]}") from None
    body = {"model": "fake", "messages": [{"role": "user", "content": "hello image"}]}
    answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=30,
                        headers={"authorization": f"Bearer {MASTER_KEY}"})  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "echo: hello image"


def exact_copy(target: Path) -> None:
    """The build context as the Dockerfile's build stage sees it: only what it COPYs."""
    for source in dockerfile_copies(DOCKERFILE.read_text()):
        path = ROOT / source
        if path.is_dir():
            shutil.copytree(path, target / source, ignore=IGNORED)
        else:
            shutil.copy2(path, target / source)


def test_wheel_from_dockerfile_copies_serves(tmp_path: Path, upstream: str) -> None:
    context = tmp_path / "context"
    context.mkdir()
    exact_copy(context)
    run = {"check": True, "capture_output": True, "cwd": tmp_path}
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(context)], **run)  # fmt: skip
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], **run)
    python = venv / "bin/python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               **run, text=True).stdout.strip())  # fmt: skip
    # The project's venv, as a plain path: its .pth files (the editable install's finder) are not run.
    (site / "project-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                    "--no-index", "-q", *map(str, wheels.glob("*.whl"))], **run)  # fmt: skip
    port, log = free_port(), tmp_path / "gateway.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMGW_", "PYTHON"))}
    process = subprocess.Popen([venv / "bin/llmgw", "serve", "--port", str(port)], cwd=tmp_path,
                               env=env | gateway_env(upstream, port), stdout=log.open("wb"),
                               stderr=subprocess.STDOUT)  # fmt: skip
    try:
        assert_serves(f"http://127.0.0.1:{port}", process, log)
    finally:
        process.terminate()
        process.wait(30)


def podman_usable() -> str | None:
    """Why podman cannot be used here, or None."""
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman buildah runc mmdebstrap; .ci/run does)"
    if subprocess.run(["podman", "info"], capture_output=True).returncode != 0:
        return "`podman info` fails"
    return None


def podman_options() -> list[str]:
    """runc (crun refuses the hybrid cgroup v1/v2 layout of CI's VM) and ulimits within the hard limits."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 32768)  # podman lowers its own to 32768
    runtime = ["--runtime", "runc"] if shutil.which("runc") else []
    return [*runtime, "--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


def podman(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    command, *rest = args
    options = podman_options()
    global_options = options[:2] if options[:1] == ["--runtime"] else []
    local = options[len(global_options) :] if command in ("build", "run") else []
    return subprocess.run(["podman", *global_options, command, *local, *rest], capture_output=True, text=True,
                          check=check, timeout=timeout)  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(podman_usable() is not None, reason=str(podman_usable()))
def test_image_builds_and_serves(tmp_path: Path, upstream: str) -> None:
    subprocess.run([ROOT / "deploy/ci/build-base.sh", BASE_IMAGE], check=True, capture_output=True)
    build = podman("build", "--pull=never", "--format", "docker", "--build-arg", f"BASE={BASE_IMAGE}",
                   "--build-arg", "EXTRAS=", "-f", str(DOCKERFILE), "-t", IMAGE, str(ROOT), check=False)  # fmt: skip
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    port, name = free_port(), f"llmgw-image-test-{os.getpid()}"
    env = [f"--env={key}={value}" for key, value in gateway_env(upstream, port).items()]
    podman("run", "--detach", "--name", name, "--network", "host", "--read-only", "--cap-drop", "ALL",
           "--security-opt", "no-new-privileges", *env, IMAGE)  # fmt: skip
    log = tmp_path / "container.log"
    try:
        running = lambda: podman("inspect", "-f", "{{.State.Running}}", name).stdout.strip() == "true"  # noqa: E731
        try:
            wait_for(lambda: not running() or get(f"http://127.0.0.1:{port}/health/live") == 200,
                     "the container", None, 120)  # fmt: skip
        finally:
            logs = podman("logs", name, check=False)
            log.write_text(logs.stdout + logs.stderr)
        assert running(), f"the container exited; its output:\n{log.read_text()[-3000:]}"
        assert_serves(f"http://127.0.0.1:{port}", None, log)
        assert podman("exec", name, "id", "-u").stdout.strip() == "10001"
        touch = podman("exec", name, "touch", "/opt/llmgw/x", check=False)
        assert touch.returncode != 0 and "Read-only file system" in touch.stderr
        assert podman("exec", name, "touch", "/tmp/x", "/var/lib/llmgw/x", check=False).returncode == 0
    finally:
        podman("rm", "--force", "--time", "5", name, check=False)
