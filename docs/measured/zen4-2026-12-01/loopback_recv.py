import socket, os, time, sys, resource
N, SIZE = 300, 1_800_000
chunk = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
port = srv.getsockname()[1]
pid = os.fork()
if pid == 0:
    c = socket.create_connection(("127.0.0.1", port)); data = b"x" * SIZE
    for _ in range(N): c.sendall(data)
    c.close(); os._exit(0)
conn, _ = srv.accept()
buf = bytearray(chunk); mv = memoryview(buf)
t0 = resource.getrusage(resource.RUSAGE_SELF); w0 = time.perf_counter(); total = 0; calls = 0
while True:
    n = conn.recv_into(mv)
    if not n: break
    total += n; calls += 1
t1 = resource.getrusage(resource.RUSAGE_SELF); w1 = time.perf_counter()
os.waitpid(pid, 0)
cpu = (t1.ru_utime - t0.ru_utime) + (t1.ru_stime - t0.ru_stime)
print(f"chunk {chunk>>10} KiB: {total/1e6:.0f} MB in {calls} recvs, receiver CPU {cpu*1e3/N:.3f} ms per 1.8 MB "
      f"(user {1e3*(t1.ru_utime-t0.ru_utime)/N:.3f}), wall {1e3*(w1-w0)/N:.3f} ms, {total/1e9/cpu:.1f} GB/s of CPU")
