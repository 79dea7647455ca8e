"""`python -m autocuda.native`: build the native library into the host cache (`native.build_into_cache`), what a
process's first prepared call runs in a helper process, so that the build finishes where that process ends
first."""
import sys

from . import build_into_cache

sys.exit(build_into_cache())
