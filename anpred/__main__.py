import sys

from anpred.cli import main

sys.exit(main())
