"""clients/python/README.md's resources-server example, run as it stands against a real daemon."""

from __future__ import annotations

import os
import re
import subprocess

from conftest import SRCDIR

README = SRCDIR / "clients" / "python" / "README.md"


def example() -> str:
    text = README.read_text()
    m = re.search(r"<!-- example:begin -->\s*```python\n(.*?)```\s*<!-- example:end -->", text, re.S)
    assert m, "no example block in clients/python/README.md"
    return m.group(1)


def test_readme_resources_server_example(daemon, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(example())
    env = dict(os.environ, LENDBOX_URL=daemon.url, LENDBOX_TOKEN=daemon.token,
               PYTHONPATH=str(SRCDIR / "clients" / "python"))
    r = subprocess.run(["/usr/bin/python3", str(script)], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["readme-episode-0 reward 1.0", "readme-episode-1 reward 1.0"]
    # the README's "Output:" block says the same
    assert "readme-episode-0 reward 1.0\nreadme-episode-1 reward 1.0" in README.read_text()
    # every sandbox the example lent is stopped
    c = daemon.client()
    assert [s for s in c.list_sessions() if s["resources_session_id"].startswith("readme-")] == []
    recs = [s for s in c.list_sandboxes() if (s.get("resources_session_id") or "").startswith("readme-")]
    assert len(recs) == 2 and all(s["state"] == "stopped" for s in recs)
