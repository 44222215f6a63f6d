import sys

from healthplane.cli.main import main

sys.exit(main())
