"""The wheel installs the `dflash` and `dflash-playground` commands under one top-level name
(dflash_core: the clone's ui/ and assets/ ship inside it), and an installed copy finds its assets
and its playground inside the install, away from the clone."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def build_wheel(tmp_path) -> Path:
    """Built from a copy (setuptools writes build/ and *.egg-info beside the sources), without build
    isolation or dependencies: nothing is fetched. The default pair's GGUF (98 MB, fetched by the
    install script) is left out of the copy to keep the test quick; the stdlib pair stands in."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "app.py"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("dflash_core", "ui", "assets"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.gguf"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(src),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
        ],
        check=True,
        cwd=tmp_path,
    )
    return next((tmp_path / "dist").glob("*.whl"))


def fresh_venv(path: Path) -> Path:
    """A new venv whose own site-packages comes first, with this environment's packages (mlx,
    gradio, ...) importable after it, so that installing without dependencies is enough. Only
    this environment's paths are added, not its .pth files: the clone's editable install is not."""
    venv.create(path, with_pip=False)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(path), "platbase": str(path)}))
    deps = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (site / "zz_test_dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")
    return site


def test_wheel_installs_working_commands_in_one_namespace(tmp_path):
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"dflash_core"}
    for f in (
        "dflash_core/ui/app.py",
        "dflash_core/commands/serve.py",
        "dflash_core/assets/prompts/python.json",
        "dflash_core/assets/models/stdlib-hybrid/draft/config.json",
    ):
        assert f in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "dflash = dflash_core.cli:main" in entry_points
    assert "dflash-playground = dflash_core.playground:main" in entry_points

    env_dir = tmp_path / "venv"
    site = fresh_venv(env_dir)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "uv",
            "pip",
            "install",
            "-q",
            "--offline",
            "--no-deps",
            "--python",
            str(env_dir / "bin" / "python"),
            str(wheel),
        ],
        check=True,
        cwd=tmp_path,
    )
    assert not {"app.py", "ui", "assets"} & {p.name for p in site.iterdir()}

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = lambda *cmd: subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    bin_dir = env_dir / "bin"

    helps = run(str(bin_dir / "dflash"), "--help")
    assert helps.returncode == 0, helps.stderr
    for command in ("generate", "serve", "benchmark", "models", "doctor", "train-draft"):
        assert command in helps.stdout
    models = run(str(bin_dir / "dflash"), "models")
    assert models.returncode == 0, models.stderr
    assert str(site / "dflash_core" / "assets" / "models") in models.stdout  # the shipped pairs, inside the install

    gen = run(
        str(bin_dir / "dflash"),
        "generate",
        "--model",
        "stdlib-hybrid",
        "--prompt",
        "def add(a, b):",
        "--max-tokens",
        "8",
        "--no-chat-template",
        "--json",
    )
    assert gen.returncode == 0, gen.stderr
    out = json.loads(gen.stdout)
    assert 1 <= len(out["tokens"]) <= 8 and out["text"] and out["stats"]["cycles"] >= 1

    found = run(
        str(bin_dir / "python"),
        "-c",
        "import dflash_core, dflash_core.layout as l; "
        "print(dflash_core.__file__, l.playground_package().__name__, l.ASSETS, sep='\\n')",
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.split("\n")[:3] == [
        str(site / "dflash_core" / "__init__.py"),
        "dflash_core.ui",
        str(site / "dflash_core" / "assets"),
    ]
    for top_level in ("ui", "app", "assets"):
        assert run(str(bin_dir / "python"), "-c", f"import {top_level}").returncode != 0

    playground = run(str(bin_dir / "dflash-playground"), "--help")
    assert playground.returncode == 0 and "--share" in playground.stdout
    assert playground.stdout.startswith("usage: dflash-playground")
    bad = run(str(bin_dir / "dflash-playground"), "--port", "70000")
    assert bad.returncode == 2 and bad.stderr.splitlines() == [
        "error: argument --port: 70000 is not a port: give a whole number 1..65535 (see `dflash-playground --help`)"
    ]


def test_install_script_installs_this_clone_as_commands(tmp_path):
    """scripts/install.sh ends with an editable install: .venv/bin/dflash runs this clone's code
    (dflash_core.ui is the clone's ui/) from any directory."""
    bin_dir = Path(sys.executable).parent
    probe = (
        "import dflash_core, dflash_core.layout as l; "
        "print(dflash_core.__file__, l.playground_package().__file__, l.ASSETS, sep='\\n')"
    )
    found = subprocess.run(
        [str(bin_dir / "python"), "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.split("\n")[:3] == [
        str(ROOT / "dflash_core" / "__init__.py"),
        str(ROOT / "ui" / "__init__.py"),
        str(ROOT / "assets"),
    ]
    helps = subprocess.run(
        [str(bin_dir / "dflash"), "generate", "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert helps.returncode == 0 and "--num-draft-tokens" in helps.stdout
    assert (bin_dir / "dflash-playground").is_file()


def test_clone_runs_without_installing(tmp_path):
    """`python app.py` / `python -m dflash_core` in a clone that is not installed: the playground
    is the top-level ui/ beside dflash_core/, the assets the clone's assets/."""
    deps = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *deps])}
    probe = "import dflash_core.layout as l; print(l.playground_package().__name__, l.ASSETS, sep='\\n')"
    # -S: no site-packages processing, so the editable install's import hook is absent
    found = subprocess.run(
        [sys.executable, "-S", "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.split("\n")[:2] == ["ui", str(ROOT / "assets")]
