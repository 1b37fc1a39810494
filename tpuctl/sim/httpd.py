"""What every simulated HTTP service (API, metadata servers, package mirror, storage emulator) listens
with."""

#: The listen backlog. http.server's is 5: when a slice's hosts connect at once (uv's parallel downloads,
#: tensorstore's parallel range reads, every host polling its metadata), the kernel drops the connections
#: beyond it (``TcpExtListenOverflows``) and each client waits out TCP's 1 s SYN retransmission, a stall
#: Google's front ends never add.
LISTEN_BACKLOG = 128
