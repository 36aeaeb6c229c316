"""`pip install .` gives the `dflash` and `dflash-playground` commands, and an installed copy
finds its assets beside its packages, away from the clone."""
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_installs_working_commands(tmp_path):
    # build from a copy (setuptools writes build/ and *.egg-info beside the sources), without
    # build isolation or dependencies: nothing is fetched (setuptools is in requirements-dev.txt)
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "app.py"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("dflash_core", "ui", "assets"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "dist")], check=True, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for f in ("app.py", "ui/app.py", "dflash_core/commands/serve.py", "assets/prompts/python.json"):
        assert f in names
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "dflash = dflash_core.cli:main" in entry_points
    assert "dflash-playground = app:main" in entry_points

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, cwd=tmp_path)
    env = {**os.environ, "PYTHONPATH": str(site)}  # the installed copy, not the clone
    run = lambda *cmd: subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    models = run(str(site / "bin" / "dflash"), "models")
    assert models.returncode == 0, models.stderr
    assert "z-lab/Qwen3-4B-DFlash-b16" in models.stdout
    assert str(site / "assets" / "models") in models.stdout  # the shipped pairs resolve inside the install
    helps = run(str(site / "bin" / "dflash"), "--help").stdout
    for command in ("generate", "serve", "benchmark", "models", "doctor", "train-draft"):
        assert command in helps
    playground = run(str(site / "bin" / "dflash-playground"), "--help")
    assert playground.returncode == 0 and "--share" in playground.stdout
