"""`python -m slo.cli`: the `slo` command without its console script."""

from slo.cli import main

raise SystemExit(main())
