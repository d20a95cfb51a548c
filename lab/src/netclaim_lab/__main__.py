import sys

from netclaim_lab.cli import main

sys.exit(main())
