"""One TCP stream's throughput between two nodes: the practical limit a collective over that link can reach.

    python scripts/bench/cluster/tcp_stream.py receive PORT            # prints its address once listening
    python scripts/bench/cluster/tcp_stream.py send HOST PORT SECONDS  # prints {"bits_per_s": ...} as JSON

The sender writes for SECONDS and the receiver acknowledges the byte count
once the sender has closed, so the rate is what arrived, over the sender's
clock. `measure` runs both inside an emulated cluster (scripts/bench/cluster/cluster.py).
"""

import json
import socket
import subprocess
import sys
import time

CHUNK = 1 << 20


def receive(port: int) -> None:
    with socket.create_server(("", port)) as server:
        print("listening", flush=True)
        connection, _ = server.accept()
        with connection:
            total = 0
            while data := connection.recv(CHUNK):
                total += len(data)
            # The sender half-closed its side; the count goes back on the same connection.
            connection.sendall(f"{total}\n".encode())


def send(host: str, port: int, seconds: float) -> dict:
    payload = bytes(CHUNK)
    with socket.create_connection((host, port), timeout=30) as connection:
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            connection.sendall(payload)
        connection.shutdown(socket.SHUT_WR)
        received = int(connection.makefile().readline())
        elapsed = time.perf_counter() - started
    return {"bytes": received, "seconds": elapsed, "bits_per_s": received * 8 / elapsed}


def measure(cluster, sender: int, receiver: int, seconds: float = 2.0, port: int = 45123) -> dict:
    """Throughput of one stream from node `sender` to node `receiver` of `cluster`."""
    listener = subprocess.Popen(cluster.in_namespace(cluster.nodes[receiver], [sys.executable, __file__, "receive",
                                                                                str(port)]),
                                stdout=subprocess.PIPE, text=True)
    try:
        listener.stdout.readline()
        out = cluster.run_in(cluster.nodes[sender],
                             f"{sys.executable} {__file__} send {cluster.addresses[receiver]} {port} {seconds}",
                             timeout=seconds + 60).stdout
        return json.loads(out)
    finally:
        listener.kill()
        listener.wait()


def main(argv):
    if argv[:1] == ["receive"]:
        receive(int(argv[1]))
    elif argv[:1] == ["send"]:
        print(json.dumps(send(argv[1], int(argv[2]), float(argv[3]))))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
