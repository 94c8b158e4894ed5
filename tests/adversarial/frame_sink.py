"""The receiving end of the frame fuzz, as a worker has it: the project's transport and authenticated stream, and
the workers' own decoding of a pipe frame (``arceusd.worker.wire_links``: phase/step/micro-batch, then the tensor
frame header and body). Daemons take no streams themselves (they refuse each after its handshake); stage workers
are the processes that read frames a peer sent, so this is what a member's mutated frames reach.

``python -m tests.adversarial.frame_sink`` prints its port, then serves until killed. Every frame is decoded;
a refusal is counted by its type and reason. A unary call answers the counters as JSON.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from arceusd.base.identity import Identity  # noqa: E402
from arceusd.transport import Stream, TransportError, open_transport  # noqa: E402
from arceusd.worker.links import LinkError  # noqa: E402
from arceusd.worker.wire_links import _PIPE, _decode  # noqa: E402
from protocol.errors import RemoteProtocolError  # noqa: E402

counts: Counter[str] = Counter()


async def on_stream(stream: Stream) -> None:
    counts["streams"] += 1
    while True:
        try:
            header, payload = await stream.receive()
        except trio.EndOfChannel:
            counts["closed"] += 1
            return
        except RemoteProtocolError as exc:
            counts[f"stream:{exc.reason}"] += 1
            return
        except TransportError as exc:
            counts[f"transport:{exc.code}"] += 1
            return
        counts["frames"] += 1
        try:
            if len(header) < _PIPE.size:
                raise LinkError("short pipe header")
            _PIPE.unpack_from(header)
            _decode(header[_PIPE.size :], payload)
            counts["decoded"] += 1
        except RemoteProtocolError as exc:
            counts[f"decode:{exc.reason}"] += 1
        except LinkError:
            counts["decode:link_error"] += 1
        except Exception as exc:  # anything else is a finding: count it by type (the test asserts none)
            counts[f"unexpected:{type(exc).__name__}"] += 1


async def on_call(_request: bytes) -> bytes:
    return json.dumps(counts).encode()


async def main() -> None:
    async with open_transport(
        Identity.generate(), "127.0.0.1", 0, unary_handler=on_call, stream_handler=on_stream
    ) as transport:
        print(transport.port, flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main)
