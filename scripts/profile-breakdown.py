#!/usr/bin/env python3
"""Where a profile's CPU goes: reads collapsed stacks (inferno-collapse-perf's output, one
`thread;frame;...;leaf count` per line, root first) and prints three tables, as shares of all
samples:

- by thread (digits folded, so rdk:broker1 and rdk:broker2 are one row);
- by concern, inclusive: a sample counts for every concern one of its frames matches, so the
  rows overlap (a produce call made inside a layer counts for both);
- by leaf, exclusive: what the sampled instruction itself was doing, by kind and the top
  functions.

Tokio's scheduler and the tracing span around the processor call are on nearly every stack of
the worker threads, so they are left out of the inclusive table (the leaf table shows their own
cost).

Used by scripts/profile; `python3 scripts/profile-breakdown.py FILE.folded`.
"""

import re
import sys
from collections import Counter

# (concern, pattern over one frame). Names are Rust paths as perf resolves them from the
# debug info (the dev profile keeps line tables), C functions by name.
# An allocator's own frames: mimalloc's, glibc's and Rust's allocation shims.
ALLOCATION = (r"^(_?mi_|malloc|free|cfree|realloc|calloc|__rust_alloc|__rust_dealloc|__rust_realloc|"
              r"__rdl_)")

CONCERNS = [
    ("poll loop (consumer thread)", r"millrace::poll::"),
    ("librdkafka consumer poll", r"BaseConsumer<C>::poll_queue|rd_kafka_consume|rd_kafka_q_serve"),
    ("copy out of librdkafka", r"millrace::record::(Record|Headers)::(from|of)_message"),
    ("hand-off to partition tasks", r"PartitionHandle>?::send|tokio::sync::mpsc"),
    ("partition task", r"millrace::partition::task::"),
    ("admit, launch, finish (lanes)", r"partition::task::.*::(admit|launch|finish)"),
    ("layers (retry, dlq, dedup, park...)", r"millrace::layer::"),
    ("produce path (producev)", r"rd_kafka_producev|FutureProducer<C,R>::send_result|BaseProducer<C,Part>::send"),
    ("acknowledgements", r"millrace::context::Context::acknowledged|DeliveryFuture|rd_kafka_dr_|oneshot"),
    ("offset tracking", r"millrace::state::offsets|millrace::state::pending"),
    ("commit path", r"millrace::commit::|rd_kafka_commit|send_offsets_to_transaction"),
    ("allocation (malloc/free)", ALLOCATION),
    ("memcpy, memmove", r"mem(move|cpy)"),
    ("page faults", r"asm_exc_page_fault|clear_page"),
    ("syscalls", r"entry_SYSCALL"),
]

LEAVES = [
    ("kernel", r"_\[k\]$"),
    ("allocation", ALLOCATION),
    ("memcpy, memmove", r"mem(move|cpy)"),
    ("librdkafka (C)", r"^(rd_|rd_kafka)"),
    ("tokio", r"^(<)?tokio::"),
    ("millrace (and the benchmark's processor)", r"^(<)?millrace(_bench)?::|^\{async_fn#0\}<millrace"),
    ("Rust core, alloc, std, hashbrown, futures", r"^(<)?(core|alloc|std|hashbrown|futures_util|futures_core)::"),
    ("rdkafka (Rust)", r"^(<)?rdkafka::"),
    ("tracing", r"^(<)?tracing"),
    ("libc, other C", r"^[a-z_][a-z0-9_]*$"),
]


def main(path):
    threads, concerns, leaves, functions = Counter(), Counter(), Counter(), Counter()
    total = 0
    compiled = [(name, re.compile(p)) for name, p in CONCERNS]
    leaf_res = [(name, re.compile(p)) for name, p in LEAVES]
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = stack.split(";")
            total += n
            threads[re.sub(r"\d+", "*", frames[0])] += n
            for name, pattern in compiled:
                if any(pattern.search(frame) for frame in frames[1:]):
                    concerns[name] += n
            leaf = frames[-1]
            functions[leaf[:100]] += n
            leaves[next((name for name, p in leaf_res if p.search(leaf)), "other")] += n
    if not total:
        sys.exit(f"{path}: no samples")

    def table(title, counter, rows=None):
        print(f"{title}:")
        for name, n in counter.most_common(rows):
            print(f"  {100 * n / total:5.1f}%  {name}")
        print()

    print(f"{path}: {total} events (the sum of the samples' periods; the shares below are of it)\n")
    table("by thread", threads, 12)
    print("by concern (inclusive: a sample counts for each concern on its stack):")
    for name, _ in CONCERNS:
        print(f"  {100 * concerns[name] / total:5.1f}%  {name}")
    print()
    table("by leaf (exclusive)", leaves)
    table("top functions (exclusive)", functions, 15)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: profile-breakdown.py FILE.folded")
    main(sys.argv[1])
