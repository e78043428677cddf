"""An episode written only against NeMo Gym's documented Python API (the seed pages:
nemo_gym.server_runtime.sandbox_lending, nemo_gym.sandbox, nemo_gym.agent_utils.sandbox_session),
names and signatures as documented there. tests/python/test_seed_script.py switches the imports
below to lendbox.gym and runs it; nothing else is changed.

Usage: python3 gym_seed_episode.py PROVIDER_JSON   (the sandbox_provider config)
"""

import asyncio
import json
import pathlib
import sys
import tempfile

from nemo_gym.server_runtime.sandbox_lending import LentSandboxes
from nemo_gym.sandbox import AsyncSandbox
from nemo_gym.agent_utils.sandbox_session import SandboxCommand, SandboxSession

SANDBOX_RUNTIME_RETURN_CODE = 125


async def main(provider):
    lent = LentSandboxes(provider, {"ttl_s": 900}, None, "/workspace", network_access="inherit")
    assert lent.network_access == "inherit" and lent.model_server is None
    assert tuple(lent.tool_servers) == ()
    assert lent.get("seed-episode") is None

    # resources server: seed
    access = await lent.lend("seed-episode", "task-1",
                             files={"/workspace/task.txt": "print 6 * 7\n",
                                    "/workspace/data.bin": b"\x00\x01\x02"})
    again = await lent.lend("seed-episode", "task-1")
    assert again.connection.descriptor == access.connection.descriptor

    # agent: the operate descriptor only
    sandbox = await AsyncSandbox.connect(access.connection.descriptor,
                                         access.connection.provider_config_ref)
    session = SandboxSession(sandbox, "/tmp/agent-session", access.workdir, "seed-harness")

    async def stage_activation():
        with tempfile.TemporaryDirectory() as d:
            script = pathlib.Path(d) / "agent.sh"
            script.write_text("expr 6 \\* 7 > /workspace/answer.txt; echo agent done\n")
            await sandbox.upload(script, "/workspace/agent.sh")
        return SandboxCommand(argv=["/bin/sh", "/workspace/agent.sh"], python="python3")

    async def collect():
        result = await sandbox.exec("cat /workspace/answer.txt")
        return {"answer": result.stdout}

    artifacts = await session.execute(stage_activation, collect, 120, 30)
    assert artifacts == {"answer": "42\n"}, artifacts
    assert "agent done" in await session.read_output_log()
    timeout = await sandbox.exec("sleep 10", timeout_s=1)
    assert timeout.return_code == SANDBOX_RUNTIME_RETURN_CODE and timeout.error_type == "timeout"
    await session.close(30)
    assert session.closed

    # resources server: grade, download, release
    grader = lent.get("seed-episode")
    verdict = await grader.exec("test \"$(cat answer.txt)\" = 42")
    assert (verdict.return_code, verdict.error_type) == (0, None)
    with tempfile.TemporaryDirectory() as d:
        await grader.download("/workspace/data.bin", pathlib.Path(d) / "data.bin")
        assert (pathlib.Path(d) / "data.bin").read_bytes() == b"\x00\x01\x02"
    await lent.release("seed-episode")
    await lent.release("seed-episode")
    assert lent.get("seed-episode") is None
    await lent.release_all()
    print("episode ok")


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
