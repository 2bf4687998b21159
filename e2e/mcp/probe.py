"""Opens one TCP connection, as a host or server Pod of the local node would, and prints the
outcome as one JSON line: {"target": "HOST:PORT", "address": the resolved IPv4 address or null,
"connected": bool, "error": str | null (prefixed "resolve:" when the name did not resolve),
"seconds": float}. A NetworkPolicy that refuses the connection shows as "connection refused"
(kube-router rejects) or a timeout (a drop); the exit status is 0 either way, the verdict is the
output's."""

import argparse
import json
import socket
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="HOST:PORT (a name is resolved through the Pod's DNS)")
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args()
    host, _, port = args.target.rpartition(":")
    started = time.monotonic()
    out = {"target": args.target, "address": None, "connected": False, "error": None}
    try:
        # Resolved first, apart: a name that does not resolve is not a refused connection.
        out["address"] = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except OSError as e:
        out["error"] = f"resolve: {e}"
    if out["address"]:
        try:
            with socket.create_connection((out["address"], int(port)), timeout=args.timeout):
                out["connected"] = True
        except OSError as e:
            out["error"] = str(e) or type(e).__name__
    out["seconds"] = round(time.monotonic() - started, 3)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
