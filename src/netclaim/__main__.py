import sys

from netclaim.cli import main

sys.exit(main())
