import sys

try:
    # Ctrl-C can arrive while the heavy imports below are still running (e.g. under ./dev up).
    from cuzk_engine.cli import main

    sys.exit(main(own_process=True))
except KeyboardInterrupt:
    sys.exit(130)
