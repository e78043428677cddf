"""docs/rl-recipe.md's code blocks, run as one script against a real daemon, so the recipe stays
true: its output must be the doc's "Output:" block, and nothing it made may be left."""

from __future__ import annotations

import os
import re
import subprocess

from conftest import SRCDIR

RECIPE = SRCDIR / "docs" / "rl-recipe.md"


def blocks(text: str) -> str:
    code = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(code) == 6, "docs/rl-recipe.md should hold six python blocks"
    return "\n".join(code)


def expected_output(text: str) -> str:
    m = re.search(r"^Output:\n\n```\n(.*?)```", text, re.S | re.M)
    assert m, "no Output: block in docs/rl-recipe.md"
    return m.group(1)


def test_rl_recipe(daemon, tmp_path):
    text = RECIPE.read_text()
    script = tmp_path / "recipe.py"
    script.write_text(blocks(text))
    env = dict(os.environ, LENDBOX_URL=daemon.url, LENDBOX_TOKEN=daemon.token,
               PYTHONPATH=str(SRCDIR / "clients" / "python"))
    r = subprocess.run(["/usr/bin/python3", str(script)], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == expected_output(text)
    c = daemon.client()
    # every sandbox of the recipe is stopped, the snapshot and the fork's capture are gone
    assert [s for s in c.list_sessions() if s["resources_session_id"].startswith("rl-")] == []
    recs = [s for s in c.list_sandboxes() if (s.get("resources_session_id") or "").startswith("rl-")]
    assert len(recs) == 5 and all(s["state"] == "stopped" for s in recs)
    assert [i["name"] for i in c.list_images() if i.get("kind") == "snapshot"] == []
    images = os.listdir(os.path.join(daemon.state_dir, "images")) if os.path.isdir(
        os.path.join(daemon.state_dir, "images")) else []
    assert [n for n in images if n.startswith("fork-")] == []
    c.close()
