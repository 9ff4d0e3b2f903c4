"""python -m tf_dietcode: the tf-dietcode command line."""

import sys

from tf_dietcode.cli import main

sys.exit(main())
