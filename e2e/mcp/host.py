"""The process of the local node's demo host image (`localhost/mcp-access/demo-host`): it waits,
doing nothing, until the Pod is stopped. What a host does is run inside it with `kubectl exec`:
`client.py` (the official MCP Python SDK as the agent) and `probe.py` (one TCP connection)."""

import signal
import sys


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("demo host ready", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
