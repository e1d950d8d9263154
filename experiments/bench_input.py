"""Input benchmark: `bertjax prepare` MB/s and peak memory, and stream examples/s per core.

Purpose: check the data layer's targets: >= 5,000 examples/s per host at seq 128, preparation
>= 10x google-research/bert's create_pretraining_data.py per core, flat memory.
Command (from the repository root; about three minutes on 2 CPU cores):

    bertjax bench input --copies 4
    bertjax bench input --copies 4 --google-bert-dir /tmp/bert-tensorflow-1.0.4

(`python experiments/bench_input.py ARGS` is the same command.)
Hardware: any CPU machine; examples are built and masked in one Python thread, the tf.data
reader's reading and parsing run in tf.data's threads beside it. Both readers are timed.
Expected (2-core VM, see docs/data.md): ~13k examples/s at seq 128, ~4k at 512 (tf.data
reader; the Python reader a little slower); prepare ~2 MB/s per core at
~120 MB peak for 4 or 16 MB of text; Google's script ~0.14 MB/s, 870 MB.
The code is `bertjax.bench.input.run(InputBenchSpec(...))`; `bertjax bench input` reads its
flags.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bertjax import cli  # noqa: E402


def main(argv: list[str] | None = None) -> int:
  """`bertjax bench input ARGV`: the benchmark's one command line, errors in its one line."""
  return cli.main(["bench", "input", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
  sys.exit(main())
