"""A DNS server on loopback for discovery tests, answering from a dict the test changes.

dnspython builds and parses the messages; this only decides the answer. `failing` makes it
answer SERVFAIL, as a resolver does when its upstream is down.
"""

from __future__ import annotations

import socket
import threading
from types import TracebackType

import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset


class DnsServer:
    def __init__(self, host: str = "127.0.0.1", ttl: int = 1) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.settimeout(0.1)
        self.address = f"{host}:{self.sock.getsockname()[1]}"
        self.ttl = ttl
        self.records: dict[str, list[str]] = {}  # name without the final dot -> IPv4 addresses
        self.failing = False
        self.queries = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="dns-server", daemon=True)

    def __enter__(self) -> DnsServer:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.queries += 1
            self.sock.sendto(self._answer(dns.message.from_wire(data)).to_wire(), peer)

    def _answer(self, query: dns.message.Message) -> dns.message.Message:
        response = dns.message.make_response(query)
        if self.failing:
            response.set_rcode(dns.rcode.SERVFAIL)
            return response
        question = query.question[0]
        name = question.name.to_text().rstrip(".").lower()
        if name not in self.records:
            response.set_rcode(dns.rcode.NXDOMAIN)
            return response
        addresses = list(self.records[name])
        if question.rdtype == dns.rdatatype.A and addresses:
            response.answer.append(dns.rrset.from_text_list(
                question.name, self.ttl, dns.rdataclass.IN, dns.rdatatype.A, addresses
            ))
        return response  # AAAA, or no address: NOERROR with no answer
