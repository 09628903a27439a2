"""Command line: `python -m treadle demo [options]`, `python -m treadle verify [options]`,
`python -m treadle --cmake-dir`."""
import argparse
import os
import sys

import treadle

_DESCRIPTION = """\
treadle: deep learning that an HPC code drives.
`python -m treadle demo` is the place to start; `python -m treadle demo --help` lists its options."""


def cmake_dir():
    """Where the wheel puts the C++ package (treadleConfig.cmake): <package dir>/lib/cmake/treadle."""
    return os.path.join(os.path.dirname(os.path.abspath(treadle.__file__)), "lib", "cmake", "treadle")


def _print_cmake_dir():
    path = cmake_dir()
    print(path)  # stdout carries only the path, for -Dtreadle_DIR=$(python -m treadle --cmake-dir)
    if not os.path.isfile(os.path.join(path, "treadleConfig.cmake")):
        print(f"treadle: no treadleConfig.cmake in {path}: this installation does not include the C++ package "
              "(a development build does not; install the C++ package with `cmake --install <build dir> "
              "--prefix <dir>` and use -DCMAKE_PREFIX_PATH=<dir>)", file=sys.stderr)
        return 1
    return 0


def version_text():
    """`treadle 0.1.0` and one line per build fact (treadle.info())."""
    facts = treadle.info()
    width = max(len(k) for k in facts)
    return "\n".join([f"treadle {facts.pop('version')}"] + [f"  {k:<{width}}  {v}" for k, v in facts.items()])


def main(argv=None):
    from . import demo

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # the benchmark suite parses its own options
        from . import bench

        return bench.main(argv[1:])
    # `python -m treadle` or the `treadle` console script
    prog = os.path.basename(sys.argv[0]) if os.path.basename(sys.argv[0]) != "__main__.py" else "python -m treadle"
    parser = argparse.ArgumentParser(prog=prog, description=_DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=version_text(),
                        help="print the version, the backends, instruction sets and library versions of this "
                             "build, and exit")
    parser.add_argument("--cmake-dir", action="store_true",
                        help="print the directory holding treadleConfig.cmake, for find_package(treadle) "
                             "from a C++ host (exit status 1 if it is not installed)")
    commands = parser.add_subparsers(dest="command", metavar="command")
    demo.add_arguments(commands.add_parser(
        "demo", help="a heat-equation simulation trains its own neural surrogate while it runs, then checks "
                     "it on held-out runs and verifies gradients (a few seconds)",
        description=demo.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    commands.add_parser("bench", help="benchmarks against PyTorch (see `python -m treadle bench --help`)")
    from . import verify

    verify.add_arguments(commands.add_parser(
        "verify", help="checks every op of this installation on this machine: gradients against finite "
                       "differences, every backend against the float64 reference (no torch needed)",
        description=verify.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    if args.cmake_dir:
        return _print_cmake_dir()
    if args.command == "demo":
        try:
            demo.check_arguments(args)
        except ValueError as e:
            parser.error(str(e))  # usage message, exit status 2
        demo.run(args)
        return 0
    if args.command == "verify":
        return verify.main(args)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
