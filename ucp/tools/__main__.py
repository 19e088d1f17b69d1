import sys

from ucp.tools.cli import main

sys.exit(main())
