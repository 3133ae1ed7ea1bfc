import sys

from cuzk_engine.cli import main

sys.exit(main())
