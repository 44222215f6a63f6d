"""The scorer's fold behind the server's fence (runtime.fencing), as its own process, for a test
to kill -9: a lease holder of ``REVISION`` (each life a higher one, as lease revisions are)
writing through the Processor exactly as the scorer service does, without the service's
stream administration (a test may shorten the streams' de-duplication window, so that an
output written twice is seen, not absorbed).

``python -m tests.support.fenced NATS_URL CREDS REVISION [SNAPSHOT_EVERY]``"""

from __future__ import annotations

import asyncio
import signal
import sys

from healthplane.runtime import logs
from healthplane.runtime.connect import connect
from healthplane.runtime.processor import Processor
from healthplane_scorer.fold import INPUTS, OUTPUTS, SERVICE, ScorerCore, ScorerState


def holder(nc, revision: int, *, snapshot_every: int = 10**9, batch: int = 256,  # type: ignore[no-untyped-def]
           log=None) -> Processor[ScorerState]:  # type: ignore[no-untyped-def]
    return Processor(nc=nc, js=nc.jetstream(), service=SERVICE, core=ScorerCore(), state_type=ScorerState,
                     inputs=INPUTS, outputs=OUTPUTS, batch=batch, snapshot_every_inputs=snapshot_every,
                     snapshot_every_s=3600, log=log, fence=lambda: revision)


async def _main(url: str, creds: str, revision: int, snapshot_every: int) -> None:
    log = logs.configure("fenced-scorer", json=True)
    nc = await connect(url, name="fenced-scorer", creds=creds or None, log=log)
    proc = holder(nc, revision, snapshot_every=snapshot_every, log=log)
    await proc.start()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, proc.stop)
    log.info("fenced scorer running", revision=revision)
    await proc.run()
    await nc.drain()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 10**9))
