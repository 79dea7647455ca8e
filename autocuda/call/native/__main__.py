"""`python -m autocuda.native [--wait]`: build the native library into the host cache (`native.build_into_cache`),
what a process's first program ready for a native plan runs in a helper process, so that the build finishes where
that process ends first. Where another process is building it, it leaves at once (exit status `native.BUSY`), or
with --wait waits for that build and then builds only if the library is still missing. `autocuda native build`
runs the same."""
import argparse
import sys

from . import build_into_cache

parser = argparse.ArgumentParser(prog="python -m autocuda.call.native", description=__doc__)
parser.add_argument("--wait", action="store_true", help="wait for a build another process is running")
sys.exit(build_into_cache(wait=parser.parse_args().wait))
