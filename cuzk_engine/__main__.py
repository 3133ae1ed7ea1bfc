import os
import sys

# The engine makes no BLAS calls, but numpy's OpenBLAS starts a thread pool on import whose
# threads spin for CPU beside the MSMs (2.4% of a `prove` at 2^14 in perf); one thread, none spare.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

try:
    # Ctrl-C can arrive while the heavy imports below are still running (e.g. under ./dev up).
    from cuzk_engine.cli import main

    sys.exit(main(own_process=True))
except KeyboardInterrupt:
    sys.exit(130)
