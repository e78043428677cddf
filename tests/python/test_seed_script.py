"""Acceptance: a script written only against NeMo Gym's documented API (gym_seed_episode.py),
with its imports switched to lendbox.gym, runs an episode end to end on a real daemon."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess

from conftest import SRCDIR, needs_agent_activations

SCRIPT = pathlib.Path(__file__).with_name("gym_seed_episode.py")


def switched() -> str:
    text = SCRIPT.read_text()
    new, n = re.subn(r"^from nemo_gym\.[\w.]+ import ", "from lendbox.gym import ", text, flags=re.M)
    assert n == 3
    return new


@needs_agent_activations
def test_seed_api_script_runs_on_lendbox(daemon, tmp_path):
    script = tmp_path / "episode.py"
    script.write_text(switched())
    provider = {"name": "lendbox", "base_url": daemon.url, "token": daemon.token}
    env = dict(os.environ, PYTHONPATH=str(SRCDIR / "clients" / "python"))
    env.pop("LENDBOX_URL", None)
    env.pop("LENDBOX_TOKEN", None)
    r = subprocess.run(["/usr/bin/python3", str(script), json.dumps(provider)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "episode ok"
