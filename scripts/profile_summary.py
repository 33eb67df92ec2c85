"""Sums a flat `perf report --sort comm,dso,sym -t '\t'` by thread and by part of the relay.

Reads the report on stdin and prints two tables: the share of samples per thread (tokio's
workers are the relay: decoding, mapping, the session loop and handing records to librdkafka;
librdkafka's threads build and send produce requests), and per part, judged by the symbol's
module path (walbox::source is decoding, walbox::outbox mapping, walbox::sink and rdkafka::
handing records over, walbox::relay the session loop) or its library (rd_* is librdkafka, linked
into the binary; libc; the kernel).
"""

import collections
import re
import sys

# Kernel symbols of a thread being switched out and in, or waking another.
SCHEDULING = ("finish_task_switch", "__schedule", "schedule", "_raw_spin_unlock_irqrestore",
              "try_to_wake_up", "futex", "enqueue_task", "dequeue_task", "update_curr",
              "pick_next", "select_task_rq", "ttwu", "_raw_spin_unlock_irq", "irqentry",
              "select_estimate_accuracy", "hrtimer")
# Kernel symbols of socket reads, writes and readiness (the replication connection, the
# brokers').
SOCKETS = ("unix_stream", "_copy_to_iter", "_copy_from_iter", "copy_user", "tcp_", "sock_",
           "skb", "ep_poll", "epoll", "ep_send", "__check_object_size", "unix_", "inet_", "ip_",
           "slab", "kmem_cache", "kfree", "__virt_addr_valid")

PARTS = [
    ("decoding (walbox::source, pgoutput::)", lambda dso, sym: "walbox::source" in sym or "pgoutput::" in sym),
    ("mapping (walbox::outbox)", lambda dso, sym: "walbox::outbox" in sym),
    ("handing over (walbox::sink, rdkafka::)", lambda dso, sym: "walbox::sink" in sym or "rdkafka::" in sym),
    ("session loop (walbox::relay, checkpoint)", lambda dso, sym: "walbox::relay" in sym),
    ("librdkafka (rd_*)", lambda dso, sym: re.match(r"\[\.\] (rd_|__rd_)", sym) is not None or "librdkafka" in dso),
    ("kernel: scheduling and wake-ups", lambda dso, sym: "kernel" in dso and any(k in sym for k in SCHEDULING)),
    ("kernel: sockets (reads, writes, polling, buffers)", lambda dso, sym: "kernel" in dso and any(k in sym for k in SOCKETS)),
    ("kernel: the rest", lambda dso, sym: "kernel" in dso),
    ("libc (malloc, free, memmove, …)", lambda dso, sym: dso.startswith("libc")),
    ("vdso (clock_gettime)", lambda dso, sym: "vdso" in dso),
    ("bytes, tokio, std and the rest", lambda dso, sym: True),
]


def thread(comm: str) -> str:
    if comm.startswith("tokio"):
        return "relay (tokio workers)"
    if comm.startswith("rdk:broker"):
        return "librdkafka broker threads"
    if comm.startswith("rdk:main"):
        return "librdkafka main thread"
    if comm.startswith("producer pol"):
        return "the producer's polling thread (delivery reports)"
    if comm.startswith("rdk:"):
        return "librdkafka other threads"
    return f"other ({comm})"


def main() -> None:
    by_thread = collections.Counter()
    by_part = collections.Counter()
    relay_parts = collections.Counter()
    total = 0.0
    for line in sys.stdin:
        if line.startswith("#") or not line.strip():
            continue
        fields = line.rstrip("\n").split("\t")
        if len(fields) < 4:
            continue
        try:
            share = float(fields[0].strip().rstrip("%"))
        except ValueError:
            continue
        comm, dso, sym = fields[1].strip(), fields[2].strip(), fields[3].strip()
        total += share
        by_thread[thread(comm)] += share
        part = next(name for name, test in PARTS if test(dso, sym))
        by_part[part] += share
        if comm.startswith("tokio"):
            relay_parts[part] += share
    print(f"samples summed: {total:.1f} %")
    print("\nby thread")
    for name, share in by_thread.most_common():
        print(f"  {share:5.1f} %  {name}")
    print("\nby part (all threads)            [on the relay's threads]")
    for name, _ in PARTS:
        print(f"  {by_part[name]:5.1f} %  {name:45} [{relay_parts[name]:5.1f} %]")


if __name__ == "__main__":
    main()
