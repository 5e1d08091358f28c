"""The course's benchmarks (`make bench`): each module prints its figures; run one as ``python -m benchmarks.bench_<name>``."""
