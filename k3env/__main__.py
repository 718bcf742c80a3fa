import sys

from k3env.cli import main

sys.exit(main())
