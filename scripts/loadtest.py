"""Load test a running service: ``python scripts/loadtest.py --help`` (installed as ``agentstream-load``).

The tool lives in the package, ``service/loadtest/``, so the console script works from a wheel too.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from service.loadtest import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
