"""The programs of ``benchmarks.bench_peers``: one workload through ours and each peer, each as its
users would write it (``python -m benchmarks.peers.run SYSTEM SPEC OUT``)."""
