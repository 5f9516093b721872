"""The node's transports, knowing nothing of recserve: HTTP/1.1 request heads on llhttp (``http1``), and HTTP/2
with gRPC framing (``h2grpc``) under per-connection budgets against floods (``h2limits``), and a TCP socket's
bytes read and written by the kernel's counts (``tcp_counts``)."""
