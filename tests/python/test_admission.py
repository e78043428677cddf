"""Admission control (lending.max_starting, lending.max_seed_queue) through lendbox.Client and
AsyncClient: a seed past the creation slots and the queue is 429 ``overloaded`` with
``Retry-After``; the clients wait as it says (with jitter) and get every seed through, within
``retry_overloaded_s``; ``retries=0`` raises at once. Every JSON answer is validated against
docs/openapi.yaml by the fixtures' hook."""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any, Callable, List

import pytest

import lendbox

N = 4


@pytest.fixture(scope="module")
def slow(request):
    """One creation at a time, no queue, every create 700 ms slower."""
    from conftest import Daemon

    d = Daemon(
        ["--set", "lending.max_starting=1", "--set", "lending.max_seed_queue=0"],
        {"LENDBOX_FAULTS": "provider.create=delay:700"},
    )
    request.addfinalizer(d.cleanup)
    return d


def _overloaded_total(c: lendbox.Client) -> int:
    m = re.search(r"^lendbox_seeds_overloaded_total (\d+)$", c.metrics(), re.M)
    assert m, "no lendbox_seeds_overloaded_total in /metrics"
    return int(m.group(1))


def _at_once(fns: List[Callable[[], Any]]) -> List[Any]:
    """Run fns on threads released together; each result or the exception it raised."""
    out: List[Any] = [None] * len(fns)
    gate = threading.Barrier(len(fns))

    def run(i: int) -> None:
        gate.wait()
        try:
            out[i] = fns[i]()
        except Exception as e:  # noqa: BLE001 - the test looks at it
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_no_retries_raises_overloaded_with_retry_after(slow):
    c = slow.client(retries=0)
    before = _overloaded_total(c)
    got = _at_once([lambda i=i: c.seed(f"adm-n{i}", "t") for i in range(N)])
    lent = [g for g in got if isinstance(g, dict)]
    refused = [g for g in got if isinstance(g, lendbox.Overloaded)]
    assert len(lent) == 1 and len(refused) == N - 1, got
    for e in refused:
        assert (e.status, e.code) == (429, "overloaded")
        assert "lending.max_starting" in e.message
        assert isinstance(e.retry_after_s, float) and 1 <= e.retry_after_s <= 60
    assert _overloaded_total(c) == before + N - 1
    # nothing was left behind for the refused ones
    sessions = {s["resources_session_id"] for s in c.list_sandboxes()}
    assert sum(f"adm-n{i}" in sessions for i in range(N)) == 1
    for i in range(N):
        c.release(f"adm-n{i}")


def test_client_retries_get_every_seed_through(slow):
    c = slow.client()  # the defaults: retry_overloaded_s 120
    before = _overloaded_total(c)
    got = _at_once([lambda i=i: c.seed(f"adm-c{i}", "t") for i in range(N)])
    assert all(isinstance(g, dict) and g["resources_session_id"] == f"adm-c{i}"
               for i, g in enumerate(got)), got
    # they were refused on the way (one slot, no queue) and waited as Retry-After said
    assert _overloaded_total(c) >= before + N - 1
    # create (not idempotent) is retried after a 429 too: it made nothing
    made = _at_once([lambda: c.create_sandbox() for _ in range(2)])
    assert all(isinstance(m, dict) for m in made), made
    for m in made:
        c.delete_sandbox(m["sandbox_id"])
    for i in range(N):
        c.release(f"adm-c{i}")


def test_async_client_retries_get_every_seed_through(slow):
    c = slow.client()
    before = _overloaded_total(c)

    async def main() -> List[Any]:
        async with slow.async_client() as ac:
            return await asyncio.gather(*(ac.seed(f"adm-a{i}", "t") for i in range(N)))

    got = asyncio.run(main())
    assert [g["resources_session_id"] for g in got] == [f"adm-a{i}" for i in range(N)]
    assert _overloaded_total(c) >= before + N - 1
    for i in range(N):
        c.release(f"adm-a{i}")


def test_retry_overloaded_s_bounds_the_wait(slow):
    c = slow.client()
    short = slow.client(retry_overloaded_s=0.5)  # less than any Retry-After (>= 1 s)
    holder = threading.Thread(target=lambda: c.seed("adm-hold", "t"))
    before = _overloaded_total(c)
    holder.start()
    try:
        # wait until the holder's create holds the only slot
        for _ in range(400):
            if re.search(r"^lendbox_seeds_starting 1$", c.metrics(), re.M):
                break
            threading.Event().wait(0.01)
        with pytest.raises(lendbox.Overloaded) as e:
            short.seed("adm-short", "t")
        assert e.value.retry_after_s is not None and e.value.retry_after_s >= 1
        assert _overloaded_total(c) == before + 1  # asked once, not retried
    finally:
        holder.join()
    c.release("adm-hold")
    with pytest.raises(lendbox.NotFound):
        c.get_session("adm-short")
