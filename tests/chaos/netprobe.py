"""Tiny network probes run inside a lab-like namespace (``ip netns exec NS python netprobe.py ...``).

Standard library only, so each probe starts in milliseconds.

    serve PORT [PORT...]        TCP: read each connection to EOF, answer the byte count
    udp-echo PORT               UDP: echo every datagram
    connect HOST PORT TIMEOUT   exit 0 when a TCP connection opens, 1 otherwise
    send HOST PORT NBYTES       send NBYTES, wait for the count; print bytes/second
    udp-loss HOST PORT N        send N datagrams 10 ms apart; print how many came back
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time


def _serve(port: int) -> None:
    server = socket.create_server(("0.0.0.0", port), reuse_port=False)

    def handle(conn: socket.socket) -> None:
        total = 0
        with conn:
            while chunk := conn.recv(65536):
                total += len(chunk)
            conn.sendall(str(total).encode())

    while True:
        conn, _ = server.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def main(argv: list[str]) -> int:
    cmd, args = argv[0], argv[1:]
    if cmd == "serve":
        for port in args[1:]:
            threading.Thread(target=_serve, args=(int(port),), daemon=True).start()
        print("ready", flush=True)
        _serve(int(args[0]))
    if cmd == "udp-echo":
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("0.0.0.0", int(args[0])))
        print("ready", flush=True)
        while True:
            data, peer = sock.recvfrom(2048)
            with contextlib.suppress(OSError):  # dropped on the way out by the fault under test
                sock.sendto(data, peer)
    if cmd == "connect":
        try:
            with socket.create_connection((args[0], int(args[1])), timeout=float(args[2])):
                return 0
        except OSError:
            return 1
    if cmd == "send":
        n = int(args[2])
        start = time.monotonic()
        with socket.create_connection((args[0], int(args[1])), timeout=60) as conn:
            conn.sendall(b"x" * n)
            conn.shutdown(socket.SHUT_WR)
            answer = conn.recv(64)
        seconds = time.monotonic() - start
        assert int(answer) == n, answer
        print(n / seconds)
        return 0
    if cmd == "udp-loss":
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.settimeout(0.01)
        got = 0
        for i in range(int(args[2])):
            with contextlib.suppress(OSError):
                sock.sendto(str(i).encode(), (args[0], int(args[1])))
            try:
                sock.recvfrom(2048)
                got += 1
            except OSError:
                pass
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            try:
                sock.recvfrom(2048)
                got += 1
            except OSError:
                pass
        print(got)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
