"""``python -m service.loadtest``: the load tool's command line (``agentstream-load``)."""

from service.loadtest.cli import main

raise SystemExit(main())
