import sys

from netclaim.cli.main import main

sys.exit(main())
