"""``python -m feature_store.ingest ...`` and ``spark-submit feature_store/ingest/__main__.py ...``.

Run as a file by spark-submit, this module is ``__main__`` outside its package, so it
imports the package absolutely: feature_store must be installed where the driver runs
(and on the executors, or shipped with ``--py-files``).
"""

import sys

from feature_store.ingest.cli import submit_main

if __name__ == "__main__":
    sys.exit(submit_main())
