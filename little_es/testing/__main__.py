"""``python -m little_es.testing serve | run``: the crash runner's fork server (:mod:`.crash`)."""

import sys

from little_es.testing.crash import main

sys.exit(main(sys.argv[1:]))
