"""`pip install ./clients/python` offline, as clients/python/README.md says: a venv that sees
Debian's packages, no index, no build isolation."""

from __future__ import annotations

import subprocess

from conftest import SRCDIR


def test_pip_install_offline(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    # a copy of the source: an in-tree build would leave build/ and *.egg-info behind
    src = tmp_path / "src"
    subprocess.run(["cp", "-r", str(SRCDIR / "clients" / "python"), str(src)], check=True)
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-index", "--no-build-isolation",
                        str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    probe = (
        "import importlib.metadata as m, lendbox, lendbox.gym;"
        "print(lendbox.__file__);"
        "print([e.value for e in m.entry_points(group='nemo_gym.sandbox_providers') if e.name == 'lendbox'])"
    )
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], cwd=tmp_path,
                         capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()
    assert out[0].startswith(str(venv)), out  # imported from the venv, not the source tree
    assert out[1] == "['lendbox.gym:LendboxProvider']"
    # the console script: `lendbox` on the venv's PATH
    r = subprocess.run([str(venv / "bin" / "lendbox"), "--help"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("usage: lendbox "), r.stdout + r.stderr
    r = subprocess.run([str(venv / "bin" / "lendbox"), "--url", "http://127.0.0.1:1", "ls"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.startswith("lendbox: cannot reach http://127.0.0.1:1")
