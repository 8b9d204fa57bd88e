import sys

from gpuledger_sim.cli import main

sys.exit(main())
