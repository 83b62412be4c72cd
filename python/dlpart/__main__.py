"""Command line: `python -m dlpart bench [options]` (see `python -m dlpart bench --help`)."""

import argparse
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    from dlpart import _bench

    parser = argparse.ArgumentParser(prog="python -m dlpart")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    bench = commands.add_parser(
        "bench",
        help="time repartition, gather and scatter against same-run references",
        description=_bench.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _bench.add_arguments(bench)
    args = parser.parse_args(argv)
    if args.command == "bench":
        return _bench.run(args)
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
